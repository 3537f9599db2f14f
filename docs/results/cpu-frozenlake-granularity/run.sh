#!/bin/bash
# Issue 35, section 3: interaction granularity on non-slippery FrozenLake from the
# solver-SFT model of each layout, 36 GRPO steps an arm (64 episodes a step), the settings
# under which RL nearly doubled the 1-action start on the CPU (GRPO, 8 maps x 8 all trained,
# mini-batches of 16, exact gradient, lr 2e-5, seq_mean_token_mean, no KL). The k1 arm is
# the run of docs/results/cpu-frozenlake-solver-start-c/run.sh (the same settings); this
# script runs all three arms, each resuming where it stopped when rerun.
# THREADS=2 when nothing else runs: k1 ~2 h, k3 ~1 h, k5 ~40 min on a 2-core AVX512 CPU.
cd "$(dirname "$0")/../../.."
.venv/bin/python experiments/data_findings.py --out runs/findings-fl --steps 36 --arms k1,k3,k5 \
    rollout.format_every_turn=false optim.micro_batch_size=8 trainer.val_every=5 \
    trainer.num_threads=${THREADS:-1}
exec .venv/bin/python experiments/data_findings.py --out runs/findings-fl --summary-only \
    --export docs/results/cpu-frozenlake-granularity
