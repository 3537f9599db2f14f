"""What `optim.detach_context` costs and saves on real multi-turn batches: the exact
actor gradient against the approximate one (gradient only through the positions that
predict agent tokens), micro-batch by micro-batch, side by side in one run.

    python bench/bench_detached_context.py                    # sokoban, 2 rollouts
    python bench/bench_detached_context.py --env frozenlake --steps 3
    STARPO_CPU_BF16=0 ATEN_CPU_CAPABILITY=avx2 python bench/bench_detached_context.py

The batches are those a training step trains on: the preset's rollout from the SFT
policy of `bench_step.py` (made there once and kept under `out/bench_step`), filtered,
with advantages. Printed per micro-batch: seconds of the exact and the approximate
forward + backward, the cosine between the two actor gradients and the ratio of their
norms (1.0 and 1.0 would be exact), and whether the losses agree (they must: only the
gradient is approximated). This is the per-step side of the cost in learning; what it
does to a whole run is measured by training with it (issue 35's comparisons).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_step import PRESETS, sft_policy  # noqa: E402
from starpo.algorithms.losses import aggregation_count  # noqa: E402
from starpo.config import load_config  # noqa: E402
from starpo.models.precision import cpu_has_native_bf16  # noqa: E402
from starpo.trainer.update_settings import UpdateSettings


def actor_gradient(models, micro, cfg, count) -> tuple[float, torch.Tensor, float]:
    """(loss, flat actor gradient, seconds) of one micro-batch's actor loss under `cfg`."""
    from starpo.trainer.update import actor_loss

    params = [p for p in models.actor.parameters() if p.requires_grad]
    micro.old_logprobs = None  # on-policy: this forward's own, as in the first mini-batch
    started = time.perf_counter()
    loss, _ = actor_loss(models, micro, UpdateSettings.of(cfg), count)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    seconds = time.perf_counter() - started
    flat = torch.cat(
        [
            g.flatten() if g is not None else p.new_zeros(p.numel())
            for g, p in zip(grads, params, strict=True)
        ]
    )
    return float(loss.detach()), flat, seconds


def compare(env: str, model_dir: Path, steps: int) -> list[tuple[float, ...]]:
    from starpo.trainer import Trainer
    from starpo.trainer.prepare import prepare

    base = [f"model.name={model_dir}", "trainer.log_trajectories=0"]
    exact_cfg = load_config(PRESETS[env], base)
    approx_cfg = load_config(PRESETS[env], [*base, "optim.detach_context=true"])
    rows = []
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(exact_cfg, Path(run_dir), quiet=True)
        for step in range(1, steps + 1):
            trajectories, metrics = trainer.rollout(step)
            kept = trainer.filter(trajectories, metrics)
            batch = trainer.batch(kept.trajectories)
            prepare(
                batch, trainer.models, UpdateSettings.of(exact_cfg), True, kept.advantage_weights
            )
            count = aggregation_count(batch.loss_mask, exact_cfg.algorithm.loss_agg)
            for _, micro in batch.split(exact_cfg.optim.micro_batch_size):
                loss_e, grad_e, sec_e = actor_gradient(trainer.models, micro, exact_cfg, count)
                loss_a, grad_a, sec_a = actor_gradient(trainer.models, micro, approx_cfg, count)
                cosine = float(torch.nn.functional.cosine_similarity(grad_e, grad_a, dim=0))
                ratio = float(grad_a.norm() / grad_e.norm().clamp_min(1e-30))
                tokens = int(micro.attention_mask.sum())
                agent = int(micro.loss_mask.sum())
                rows.append(
                    (
                        step,
                        len(micro),
                        tokens,
                        agent,
                        sec_e,
                        sec_a,
                        cosine,
                        ratio,
                        abs(loss_e - loss_a),
                    )
                )
                print(
                    f"  step {step} micro-batch: {len(micro)} rows, {tokens} tokens "
                    f"({agent} agent): exact {sec_e:.1f} s, approx {sec_a:.1f} s "
                    f"({sec_e / sec_a:.2f}x), cosine {cosine:.3f}, norm ratio {ratio:.3f}",
                    flush=True,
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="sokoban", choices=PRESETS)
    parser.add_argument("--steps", type=int, default=2, help="rollouts to take batches from")
    parser.add_argument("--out", type=Path, default=Path("out/bench_step"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16 "
        f"{'yes' if cpu_has_native_bf16() else 'no'}, torch {torch.__version__}"
    )
    rows = compare(args.env, sft_policy(args.env, args.out, 64, 2), args.steps)
    exact = sum(r[4] for r in rows)
    approx = sum(r[5] for r in rows)
    cosines = [r[6] for r in rows]
    ratios = [r[7] for r in rows]
    print(
        f"\n{args.env}: {len(rows)} micro-batches; forward + backward exact {exact:.1f} s, "
        f"approximate {approx:.1f} s ({exact / approx:.2f}x); gradient cosine "
        f"min {min(cosines):.3f} mean {sum(cosines) / len(cosines):.3f}; norm ratio "
        f"{min(ratios):.3f}-{max(ratios):.3f}; largest loss difference "
        f"{max(r[8] for r in rows):.1e}"
    )


if __name__ == "__main__":
    main()
