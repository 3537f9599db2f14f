#!/bin/bash
# Issue 35, section 2: FrozenLake 4x4 non-slippery (plain grid) from the format-only warm start
# of runs/fl-random-16x4 (sft/ and sft-eval/ are links to it), then GiGPO on 8 maps x 8, all
# trained, lr 3e-5, two optimizer steps a rollout, detached context. GRPO with 16 maps x 4
# drifted to Left/Up in 10 steps (58% / 36% of validation moves, 19.7% of moves a cell closer
# to the goal against 33.4% for random moves): GiGPO's step-level advantage compares the
# moves made from the same state within a group (every episode of a group starts on the same
# cell), and its discounted returns (0.95 a turn) price a wasted move.
# Rerun this script to resume (--out resumes). THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/starpo demo --env frozenlake --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --rl-minutes 900 --steps 150 --methods gigpo --out runs/fl-random-gigpo \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false \
    filter.enabled=false optim.mini_batch_size=32 optim.micro_batch_size=8 \
    optim.actor_lr=3e-5 algorithm.loss_agg=seq_mean_token_mean optim.detach_context=true \
    trainer.val_every=10 trainer.save_every=5 trainer.num_threads=${THREADS:-1}
