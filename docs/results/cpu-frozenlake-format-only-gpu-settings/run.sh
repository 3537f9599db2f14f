#!/bin/bash
# Issue 35, section 2: the format-only start (SFT on 256 random-policy episodes, 1 epoch)
# trained with exactly the settings under which the solver-SFT start learned on the GPU and
# on this CPU (docs/results/cpu-frozenlake-solver-start-c/run.sh): GRPO, 8 maps x 8 all
# trained, mini-batches of 16 (4 optimizer steps a rollout), the exact gradient, lr 2e-5,
# seq_mean_token_mean, no KL. The solver-SFT start measured there plays *below* random
# move by move (optimal moves 22% against random's 35%), so it does not read the map
# either: is the settings' difference what kept the earlier format-only runs (detached
# context, 2 optimizer steps a rollout, lr 3e-5) flat?
# Rerun this script to resume (--out resumes). THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/starpo demo --env frozenlake --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --rl-minutes 240 --steps 36 --methods grpo --out runs/fl-random-gpu-settings \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false filter.enabled=false \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=2e-5 \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.num_threads=${THREADS:-1}
