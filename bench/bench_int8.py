"""Why starpo has no int8 rollout dtype on CPUs: PyTorch's int8 matmuls side by side with the
fp32 oneDNN kernel the lean backend uses, and what fbgemm's dynamic int8 linear (the only
fast one) does to the rollout policy's log-probs.

1. Speed of one projection of SmolLM2-135M at several row counts (decode batch sizes):
   fp32 oneDNN on packed weights (the lean backend's kernel), weight-only int8
   (`torch._weight_int8pack_mm`), `torch._int_mm` (int8 x int8), fbgemm's dynamic int8
   linear (int8 weights per output channel, activations quantised per call).
2. The bandit preset's first-turn rollouts (64 episodes) decoded by the lean backend with
   fbgemm int8 in the named projections (LM head in fp32), rescored by the fp32 training
   forward: the mean |log-prob difference| on the sampled tokens is what the PPO ratio
   would have to absorb (fp32 rollouts: within 1e-5, tested).

Run: python bench/bench_int8.py
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings

import torch

from starpo.rollout.backends.lean import LeanBackend
from starpo.rollout.backends.lean_decoder import LeanLlama
from starpo.rollout.backends.linear_kernels import _onednn_linear, pack_weight

SHAPES = {"qkv": (960, 576), "gate_up": (3072, 576), "down": (576, 1536)}
VARIANTS = {
    "fp32": (),
    "int8 gate_up": ("gate_up",),
    "int8 qkv, gate_up": ("qkv", "gate_up"),
    "int8 all but down": ("qkv", "o", "gate_up"),
    "int8 all": ("qkv", "o", "gate_up", "down"),
}


def seconds(repeats: int, fn, *args) -> float:
    fn(*args)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args)
    return (time.perf_counter() - start) / repeats


def fbgemm_int8(weight: torch.Tensor):
    """fbgemm's packed int8 weight (symmetric, one scale per output channel)."""
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
    zero = torch.zeros(len(weight), dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated in PyTorch 2.13
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_channel(weight.float(), scale, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(quantized, None)


def matmul_speeds(rows_list: list[int], repeats: int) -> None:
    print("per projection, ms (lower is better); ratio = fp32 oneDNN / contender")
    for rows in rows_list:
        for name, (out, inp) in SHAPES.items():
            weight, x = torch.randn(out, inp) * 0.05, torch.randn(rows, inp)
            packed = pack_weight("onednn", weight)
            fp32 = seconds(repeats, _onednn_linear, x, packed, None)
            dynamic = torch.ops.quantized.linear_dynamic
            fbgemm = seconds(repeats, dynamic, x, fbgemm_int8(weight), True)
            scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
            w8 = (weight / scales[:, None]).round().to(torch.int8)
            weight_only = seconds(3, torch._weight_int8pack_mm, x, w8, scales)
            x8 = torch.randint(-127, 127, (max(rows, 17), inp), dtype=torch.int8)  # M > 16
            int_mm = seconds(3, torch._int_mm, x8, w8.t())
            print(
                f"  rows {rows:>3} {name:<8} fp32 onednn {fp32 * 1e3:7.2f}"
                f" | fbgemm int8 {fbgemm * 1e3:7.2f} ({fp32 / fbgemm:4.2f}x)"
                f" | _weight_int8pack_mm {weight_only * 1e3:7.2f} ({fp32 / weight_only:5.3f}x)"
                f" | _int_mm {int_mm * 1e3:7.2f} ({fp32 / int_mm:5.3f}x)"
            )


def int8_lean(model, projections: tuple[str, ...]) -> LeanLlama:
    """A lean decoder whose `projections` run on fbgemm int8, the rest on fp32 oneDNN."""
    lean = LeanLlama(model, torch.float32, "onednn")
    lean.run_layers = [  # quantised from the dense fp32 weights (`layers`), not the packed
        dataclasses.replace(
            run, **{p: ("int8", fbgemm_int8(getattr(dense, p))) for p in projections}
        )
        for run, dense in zip(lean.run_layers, lean.layers, strict=True)
    ]
    fp32 = lean.linear

    def linear(x, weight, bias):
        if isinstance(weight, tuple):
            y = torch.ops.quantized.linear_dynamic(x, weight[1], True)
            return y if bias is None else y + bias
        return fp32(x, weight, bias)

    lean.linear = linear
    return lean


def logprob_gaps(groups: int) -> None:
    from starpo.compute.batch import build_batch
    from starpo.compute.forward import policy_logprobs
    from starpo.config import load_config
    from starpo.models import load_model
    from starpo.rollout.engine import RolloutEngine

    cfg = load_config("cpu-bandit-starpo-s", [])
    model, tokenizer = load_model(cfg.model.name, device="cpu", dtype="fp32")
    print(f"\nbandit preset, {groups} x {cfg.rollout.group_size} episodes, lean backend")
    for label, projections in VARIANTS.items():
        backend = LeanBackend(model, pad_token_id=tokenizer.pad_token_id, seed=1)
        if projections:
            backend.lean = int8_lean(model, projections)
        engine = RolloutEngine(backend, tokenizer, cfg.rollout.settings())
        start = time.perf_counter()
        trajectories = engine.run("bandit", list(range(groups)), cfg.rollout.group_size)
        took = time.perf_counter() - start
        batch = build_batch(trajectories, tokenizer.pad_token_id, per_turn_rewards=False)
        with torch.no_grad():
            train, _ = policy_logprobs(model, batch, cfg.rollout.temperature, with_entropy=False)
        gap = (train - batch.rollout_logprobs)[batch.loss_mask.bool()].abs()
        print(
            f"  {label:<18} rollout {took:5.2f} s  |log-prob gap| mean {gap.mean():.2e}"
            f" max {gap.max():.2e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--groups", type=int, default=8, help="bandit groups of 8 episodes")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"CPU capability {capability}, {args.threads} threads, PyTorch {torch.__version__}")
    matmul_speeds(args.rows, args.repeats)
    logprob_gaps(args.groups)


if __name__ == "__main__":
    main()
