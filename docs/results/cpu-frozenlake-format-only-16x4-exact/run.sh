#!/bin/bash
# Issue 35, section 2, sixth try: the format-only start (SFT on 256 random-policy episodes,
# 1 epoch) trained with the fifth try's settings (docs/results/cpu-frozenlake-format-only-
# gpu-settings/run.sh) but 16 maps x 4 tries a step instead of 8 x 8: from the solver start,
# 16 x 4 reached 67.6% against 8 x 8's 53.9% in 36 steps (task diversity, results page).
# The run on the results page used the fifth try's SFT model (runs/fl-random-gpu-settings'
# sft/ and sft-eval/, linked in by hand); without them this trains the same SFT stage.
# Stopped at step 15 of 100 (drift to Left); rerun to resume. THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/starpo demo --env frozenlake --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --rl-minutes 600 --steps 100 --methods grpo --out runs/fl-random-16x4 \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false filter.enabled=false \
    rollout.num_groups=16 rollout.group_size=4 \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=2e-5 \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.num_threads=${THREADS:-1}
