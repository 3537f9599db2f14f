#!/bin/bash
# Issue 64's invoice rows: SFT on 96 gold episodes (2 epochs, lr 2e-4), then StarPO-S
# (the cpu-invoice-sft-starpo-s preset: GRPO, top-25% groups, no KL, lr 5e-6, 8 cases x 8)
# for STEPS steps (5: the 2026-12-04 run's 30-minute budget, which collapsed the line
# checks onto "price_mismatch"), evaluated on 256 validation cases. Since 2026-12-07 every
# step logs the answers (answer_share/<reason>, family_success/<reason>, answer_overuse)
# that the detector's `answers` rule reads: its metrics are what a test of that rule on a
# real collapse needs. Rerun the same command to resume.
#   bash docs/results/cpu-invoice/run.sh                     # runs/invoice-answers
#   TURN_REWARD=0.1 bash docs/results/cpu-invoice/run.sh     # + turn-level rewards
#   STEPS=30 bash docs/results/cpu-invoice/run.sh            # longer
# Cost (2026-12-04, 2-core AVX512 + AMX, bf16 autocast): SFT 19 min, an RL step 6-7.5 min,
# an evaluation of 256 cases 20-28 min; on a 2-core AVX2-only CPU about twice that.
cd "$(dirname "$0")/../../.."  # the repository root
STEPS=${STEPS:-5}
TURN_REWARD=${TURN_REWARD:-0}
RUN=runs/invoice-answers
EXTRA=()
if [ "$STEPS" != 5 ]; then RUN=$RUN-$STEPS; fi
if [ "$TURN_REWARD" != 0 ]; then
  RUN=$RUN-turn$TURN_REWARD
  EXTRA=("env.kwargs={turn_reward: $TURN_REWARD}")
fi
exec .venv/bin/starpo demo --env invoice --no-base --sft-episodes 96 --sft-epochs 2 \
    --steps "$STEPS" --out "$RUN" trainer.keep_every=5 "${EXTRA[@]}"
