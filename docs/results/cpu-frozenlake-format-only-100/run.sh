#!/bin/bash
# Issue 35, section 2 at the issue's stated length: the fifth try (docs/results/cpu-
# frozenlake-format-only-gpu-settings/run.sh: format-only start, GRPO with exactly the
# settings that nearly doubled the solver start on this CPU, 36 steps, no gain) run on to
# 100 steps. The run on the results page continued the fifth try's step-36 checkpoint
# (the recipe continues a finished RL stage asked for more steps; the learning rate is
# constant, so that is the same run as 100 steps from the start); from scratch this script
# trains the same SFT stage first. Rerun it to resume. THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/starpo demo --env frozenlake --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --rl-minutes 600 --steps 100 --methods grpo --out runs/fl-random-100 \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false filter.enabled=false \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=2e-5 \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.num_threads=${THREADS:-1}
