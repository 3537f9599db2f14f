#!/bin/bash
# Issue 62: does more fine-tuning carry RFT's lean into the policy? The RFT round of
# `ARM=rft run.sh` kept 201 of 1,024 sampled episodes (65% of their moves optimal) and one
# epoch at lr 1e-4 left the policy where it was (18.4% against the start's 19.5%). This
# fine-tunes the same format-only SFT model on the same kept episodes for EPOCHS epochs at
# LR (default 3 and 2e-4: the solver-SFT start's recipe) and evaluates it as the recipe
# does (the 256 validation seeds from 123, temperature 0.5). Needs runs/fl-levers-rft-s1
# (its rft-1/samples) and runs/fl-curriculum-s1/sft. Output: runs/fl-rft-e$EPOCHS-lr$LR/.
set -e
cd "$(dirname "$0")/../../.."  # the repository root
EPOCHS=${EPOCHS:-3}
LR=${LR:-2e-4}
OUT=runs/fl-rft-e$EPOCHS-lr$LR
CONFIG=docs/results/cpu-frozenlake-levers/rl-grpo-config.yaml  # the RL stage's layout
[ -f $OUT/model.safetensors ] || .venv/bin/starpo sft runs/fl-levers-rft-s1/rft-1/samples \
    --only-success --model runs/fl-curriculum-s1/sft --config $CONFIG \
    --epochs $EPOCHS --lr $LR --out $OUT
[ -f $OUT/eval/summary.json ] || .venv/bin/starpo eval --env frozenlake --policy model \
    --model $OUT --env-arg is_slippery=false --episodes 256 --seed-start 123 \
    --temperature 0.5 --max-turns 10 --max-actions-per-turn 1 --max-actions-per-traj 10 \
    --max-new-tokens 32 --max-response-words 30 --no-think --stop-at-answer \
    --no-format-every-turn --out $OUT/eval
python3 -c "import json; s=json.load(open('$OUT/eval/summary.json')); print({k: s.get(k) for k in ('success', 'success_ci95_low', 'success_ci95_high', 'optimal_action_rate', 'num_episodes')})"
