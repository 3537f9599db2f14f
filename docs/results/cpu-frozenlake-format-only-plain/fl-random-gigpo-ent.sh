#!/bin/bash
# Issue 35, section 2: runs/fl-random-gigpo (GiGPO from the FrozenLake format-only start,
# 8 maps x 8, all trained, lr 3e-5) drifted its move marginal within 10 steps (Right, then
# Up/Left). Here the same with an entropy bonus of 0.1 instead of 0.001: from a start whose
# moves are uniform whatever the map, a KL to the start is (up to a constant) minus the
# entropy of the move, so the bonus is the restoring force that keeps the marginal from
# drifting while the rare successes pull toward reading the map.
# Rerun this script to resume (--out resumes). THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/starpo demo --env frozenlake --sft-from random --sft-episodes 256 --sft-epochs 1 \
    --no-base --rl-minutes 900 --steps 150 --methods gigpo --out runs/fl-random-gigpo-ent \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false \
    filter.enabled=false optim.mini_batch_size=32 optim.micro_batch_size=8 \
    optim.actor_lr=3e-5 algorithm.loss_agg=seq_mean_token_mean optim.detach_context=true \
    algorithm.entropy_coef=0.1 \
    trainer.val_every=10 trainer.save_every=5 trainer.num_threads=${THREADS:-1}
