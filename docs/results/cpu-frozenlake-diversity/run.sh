#!/bin/bash
# Issue 35, section 3: task diversity on non-slippery FrozenLake from the solver-SFT model,
# 36 GRPO steps an arm at 64 episodes a step: 16 maps x 4 tries (16x4) against 8 x 8 (k1),
# the settings under which RL nearly doubled the 1-action start on the CPU (GRPO, all groups
# trained, mini-batches of 16, exact gradient, lr 2e-5, seq_mean_token_mean, no KL). k1 is
# the run of docs/results/cpu-frozenlake-solver-start-c/run.sh (the same settings) and
# docs/results/cpu-frozenlake-granularity/run.sh; 4x16 is a third arm, not run yet.
# Each arm resumes where it stopped when rerun. THREADS=2 when nothing else runs:
# ~1 h 45 min an arm on a 2-core AVX512 CPU.
cd "$(dirname "$0")/../../.."
.venv/bin/python experiments/data_findings.py --out runs/findings-fl --steps 36 --arms k1 16x4 \
    rollout.format_every_turn=false optim.micro_batch_size=8 trainer.val_every=5 \
    trainer.num_threads=${THREADS:-1}
exec .venv/bin/python experiments/data_findings.py --out runs/findings-fl --summary-only \
    --arms 16x4 k1 --export docs/results/cpu-frozenlake-diversity
