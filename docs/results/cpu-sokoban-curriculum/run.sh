#!/bin/bash
# Issue 62, section 5: Sokoban 6x6 (1 box) from a format-only start (SFT on 256 random-
# policy episodes, 10.2% on 256 seeds) with closed-loop pass-rate control: episodes start
# k moves before the end of the solver's solution, k steered towards a pass rate of 1/2.
# RL as the FrozenLake runs that learned (GRPO, all groups trained, exact gradient, lr
# 2e-5, 8 levels x 8 a step, 4 optimizer steps a rollout), 60 steps. Rerun to resume.
# LR (default 2e-5) and STEPS (default 60) override; another LR names the folder
# runs/sokoban-curriculum-lr$LR-s$SEED. CURRICULUM=false plays the full task every step.
# RFT=1 puts FrozenLake's best lever before RL: one round of rejection-sampling fine-tuning
# (128 training seeds x 8 samples, the successes fine-tuned for 3 epochs at lr 2e-4), in
# runs/sokoban-<curriculum|plain>-rft3-s$SEED; link sft/ and sft-eval/ from the SEED's run
# without it to reuse its format-only SFT stage.
cd "$(dirname "$0")/../../.."  # the repository root
SEED=${SEED:-1}
LR=${LR:-2e-5}
RUN=runs/sokoban-curriculum-s${SEED}
[ "$LR" = 2e-5 ] || RUN=runs/sokoban-curriculum-lr$LR-s${SEED}
[ "${CURRICULUM:-true}" = true ] || RUN=${RUN/curriculum/plain}
LEVERS=()
if [ "${RFT:-0}" = 1 ]; then
  LEVERS=(--rft-rounds 1 --rft-seeds 128 --rft-samples 8 --rft-epochs 3 --rft-lr 2e-4)
  RUN=${RUN/-s$SEED/-rft3-s$SEED}
fi
exec .venv/bin/starpo demo --env sokoban --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --steps ${STEPS:-60} --methods grpo --out $RUN "${LEVERS[@]}" \
    rollout.format_every_turn=false filter.enabled=false \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=$LR \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.keep_every=10 trainer.seed=${SEED} curriculum.enabled=${CURRICULUM:-true} \
    trainer.num_threads=${THREADS:-1}
