#!/bin/bash
# Issue 35, section 2: FrozenLake 4x4 non-slippery (plain grid) from a format-only warm start
# (SFT on 256 random-policy episodes), then GRPO on 16 maps x 4 rollouts a step, all trained
# (no filter: the FL-coord run's top-25% kept 2 maps a step and chased one action at a time;
# more maps a step average out the state-independent part of the update), lr 3e-5, two
# optimizer steps a rollout, detached context (its gradient had cosine 0.988 with the exact).
# Rerun this script to resume (--out resumes). THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/starpo demo --env frozenlake --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --rl-minutes 900 --steps 150 --methods grpo --out runs/fl-random-16x4 \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false \
    rollout.num_groups=16 rollout.group_size=4 filter.enabled=false \
    optim.mini_batch_size=32 optim.micro_batch_size=8 optim.actor_lr=3e-5 \
    algorithm.loss_agg=seq_mean_token_mean optim.detach_context=true \
    trainer.val_every=10 trainer.save_every=5 trainer.num_threads=${THREADS:-1}
