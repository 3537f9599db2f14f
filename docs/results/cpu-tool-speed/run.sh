#!/bin/bash
# Issue 63's tool-speed benches, one after another (each alone on the machine: two heavy
# jobs on 2 cores slow each other several times over). Output in runs/bench-*.log; the
# results folder keeps what they printed, progress bars left out.
#   bash docs/results/cpu-tool-speed/run.sh            # the step, then an evaluation batch
#   WAIT_PID=1234 bash docs/results/cpu-tool-speed/run.sh   # start once that job has ended
#   bash docs/results/cpu-tool-speed/run.sh padding    # one call a level, padding dropped
cd "$(dirname "$0")/../../.."  # the repository root
if [ -n "$WAIT_PID" ]; then
  while kill -0 "$WAIT_PID" 2>/dev/null; do sleep 20; done
fi
mkdir -p runs
if [ "$1" = padding ]; then
  # A decode step over an RL step's prompt tree (second table), then an evaluation's batch
  # with the cache's padding kept and dropped (one block, fp32).
  .venv/bin/python bench/bench_decode_attention.py > runs/bench-decode-attention-tree.log 2>&1
  .venv/bin/python bench/bench_shared_start.py --cases 32 --repeats 1 --ways 2 3 \
      > runs/bench-shared-start-padding.log 2>&1
  exit
fi
# One preset step against the bf16 cache (10), and signatures + 4x8 + no context gradient
# + the bf16 cache (11); contender 9 (the same without the bf16 cache) was measured on
# 2026-12-07 before it (bench-step-invoice-2026-12-07.txt).
.venv/bin/python bench/bench_step.py --env invoice --contenders 0 10 11 \
    --sft-episodes 8 --sft-epochs 1 > runs/bench-step-invoice-kv.log 2>&1
# One decode step's attention three ways, against the read bandwidth.
.venv/bin/python bench/bench_decode_attention.py > runs/bench-decode-attention.log 2>&1
# An evaluation's batch of 32 cases: a copy of the system prompt per case, one block,
# one block with a bf16 cache.
.venv/bin/python bench/bench_shared_start.py --cases 32 --repeats 1 --bf16-cache \
    > runs/bench-shared-start-kv.log 2>&1
