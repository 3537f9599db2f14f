#!/bin/bash
# Issue 35, section 2 ("also from the solver-SFT model"): the GPU run that doubled success
# in 15 steps (docs/results/gpu-frozenlake-rl-beyond-start), with its settings, on a 2-core
# CPU (this session's: AMD EPYC with AVX512 and native bf16, bf16 autocast): SFT on 200
# solver episodes, then GRPO, 8 maps x 8 all trained, mini-batches of 16 (4 optimizer
# steps a rollout), the exact gradient, lr 2e-5, seq_mean_token_mean, no KL. Started with
# 20 steps; at step 11 (validation 0.25 -> 0.31 -> 0.31 on 64 seeds) extended to 36 to see
# whether the CPU run needs more steps than the GPU's 15. The earlier CPU tries stopped at
# 9 steps (shared CPU) or used the cheap steps (4 maps, detached context): no gain.
# Rerun this script to resume (--out resumes). THREADS=2 when nothing else runs.
cd "$(dirname "$0")/../../.."  # the repository root
exec .venv/bin/starpo demo --env frozenlake --no-base --rl-minutes 150 --steps 36 \
    --methods grpo --out runs/fl-solver-avx2 \
    'env.kwargs={is_slippery: false}' rollout.format_every_turn=false filter.enabled=false \
    optim.mini_batch_size=16 optim.micro_batch_size=8 optim.actor_lr=2e-5 \
    algorithm.loss_agg=seq_mean_token_mean trainer.val_every=5 trainer.save_every=5 \
    trainer.num_threads=${THREADS:-1}
