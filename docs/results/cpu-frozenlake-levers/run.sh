#!/bin/bash
# Issue 62, section 5's ablation on FrozenLake 4x4 non-slippery at an equal budget (30 GRPO
# steps of 8 maps x 8, the settings of docs/results/cpu-frozenlake-curriculum/run.sh):
#   ARM=plain        GRPO from the format-only start, no lever
#   ARM=rft          + rejection-sampling fine-tuning (1 round: 128 training seeds x 8)
#   ARM=rft3         the same round fine-tuned for 3 epochs at lr 2e-4 (rft-epochs.sh's
#                    26.6% against 1 epoch at 1e-4's 18.4%)
#   ARM=rft3x2       a second such round (128 new seeds x 8) sampled from the first's model
#   ARM=world-model  SFT on random play with the state read back and the next one predicted
#                    in the think block (thinks, so every turn is ~12x longer to decode)
#   ARM=all          world-model start + RFT + pass-rate control
# (+ pass-rate control alone is the curriculum run's folder.) LR sets the actor's learning
# rate (2e-5, the 100-step run's, unless given; another value names the folder
# runs/fl-levers-$ARM-lr$LR-s$SEED). Each arm's folder is runs/fl-levers-$ARM-s$SEED; rerun
# to resume. For plain, rft and rft3, link the curriculum run's
# sft/ and sft-eval/ into the folder first to reuse its format-only SFT stage:
#   mkdir -p runs/fl-levers-rft-s1 && ln -s ../fl-curriculum-s1/sft runs/fl-levers-rft-s1/sft
#   ln -s ../fl-curriculum-s1/sft-eval runs/fl-levers-rft-s1/sft-eval
# For rft3x2, link rft3's first round too (a round is made by the rounds before it alone):
#   ln -s ../fl-levers-rft3-s1/rft-1 runs/fl-levers-rft3x2-s1/rft-1
# SLIPPERY=1 plays the slippery lake (a move goes sideways 2 times in 3; random play 23.0%,
# the optimal policy 51.4%) into runs/fl-levers-$ARM-slippery-s$SEED, with an SFT stage of
# its own (random play on the slippery lake).
# SEED is the RL stage's seed: SFT and RFT sample with seeds of their own, so a SEED=2 arm
# links SEED=1's rft-1/ and rft-eval/ as well (rerunning them makes the same round).
cd "$(dirname "$0")/../../.."  # the repository root
ARM=${ARM:?set ARM=plain, rft, rft3, rft3x2, world-model or all}
SEED=${SEED:-1}
LR=${LR:-2e-5}
RUN=runs/fl-levers-$ARM-s$SEED
[ "$LR" = 2e-5 ] || RUN=runs/fl-levers-$ARM-lr$LR-s$SEED
# KL=c adds a KL term to the RL start (RFT's model) at coefficient c (k3, as a loss), in
# runs/fl-levers-$ARM-kl$c-s$SEED: against the drift onto one move both RFT3 seeds showed.
KL=${KL:-0}
KL_ARG=()
if [ "$KL" != 0 ]; then
  KL_ARG=(algorithm.kl_coef=$KL)
  RUN=${RUN/-s$SEED/-kl$KL-s$SEED}
fi
SLIPPERY_KWARG=false
if [ "${SLIPPERY:-0}" = 1 ]; then
  SLIPPERY_KWARG=true
  RUN=${RUN/-s$SEED/-slippery-s$SEED}
fi
case "$ARM" in
  plain) LEVERS=(--sft-from random) ;;
  rft) LEVERS=(--sft-from random --rft-rounds 1 --rft-seeds 128 --rft-samples 8) ;;
  rft3) LEVERS=(--sft-from random --rft-rounds 1 --rft-seeds 128 --rft-samples 8
                --rft-epochs 3 --rft-lr 2e-4) ;;
  rft3x2) LEVERS=(--sft-from random --rft-rounds 2 --rft-seeds 128 --rft-samples 8
                  --rft-epochs 3 --rft-lr 2e-4) ;;
  world-model) LEVERS=(--sft-from world-model) ;;
  all) LEVERS=(--sft-from world-model --rft-rounds 1 --rft-seeds 128 --rft-samples 8
               curriculum.enabled=true) ;;
  *) echo "ARM must be plain, rft, rft3, rft3x2, world-model or all, not $ARM" >&2; exit 2 ;;
esac
exec .venv/bin/starpo demo --env frozenlake --sft-episodes 256 --sft-epochs 1 \
    --no-base --steps 30 --methods grpo --out $RUN "${LEVERS[@]}" \
    "env.kwargs={is_slippery: $SLIPPERY_KWARG}" rollout.format_every_turn=false \
    filter.enabled=false \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=$LR \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.keep_every=10 trainer.seed=$SEED trainer.num_threads=${THREADS:-1} "${KL_ARG[@]}"
