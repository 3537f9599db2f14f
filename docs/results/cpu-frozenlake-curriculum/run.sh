#!/bin/bash
# Issue 62, section 5: FrozenLake 4x4 non-slippery from the format-only start (SFT on 256
# random-policy episodes, 19.1% on 256 seeds) with closed-loop pass-rate control: episodes
# start k moves before the end of the solver's path, k steered towards a pass rate of 1/2
# (curriculum.*). Everything else is the 100-step run's (docs/results/cpu-frozenlake-format-
# only-100/run.sh): GRPO, all groups trained, exact gradient, lr 2e-5, 8 maps x 8 a step,
# 30 steps. SEED picks the training seed (trainer.seed; the SFT stage is the same for
# every seed: link runs/fl-curriculum-s1/sft and sft-eval into another seed's folder to
# reuse it). Rerun to resume. THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
SEED=${SEED:-1}
exec .venv/bin/starpo demo --env frozenlake --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --steps 30 --methods grpo --out runs/fl-curriculum-s${SEED} \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false filter.enabled=false \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=2e-5 \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.keep_every=10 trainer.seed=${SEED} curriculum.enabled=true \
    trainer.num_threads=${THREADS:-1}
