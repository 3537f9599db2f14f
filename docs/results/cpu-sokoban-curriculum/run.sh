#!/bin/bash
# Issue 62, section 5: Sokoban 6x6 (1 box) from a format-only start (SFT on 256 random-
# policy episodes, 10.2% on 256 seeds) with closed-loop pass-rate control: episodes start
# k moves before the end of the solver's solution, k steered towards a pass rate of 1/2.
# RL as the FrozenLake runs that learned (GRPO, all groups trained, exact gradient, lr
# 2e-5, 8 levels x 8 a step, 4 optimizer steps a rollout), 60 steps. Rerun to resume.
cd "$(dirname "$0")/../../.."  # the repository root
SEED=${SEED:-1}
exec .venv/bin/starpo demo --env sokoban --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --steps 60 --methods grpo --out runs/sokoban-curriculum-s${SEED} \
    rollout.format_every_turn=false filter.enabled=false \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=2e-5 \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.keep_every=10 trainer.seed=${SEED} curriculum.enabled=true \
    trainer.num_threads=${THREADS:-1}
