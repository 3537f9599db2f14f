"""Where a decode step's time goes: torch.profiler over the lean backend's decode loop.

    python bench/profile_decode.py [--batch 8] [--tokens 32] [--dtype fp32] [--top 15]

Generates `--tokens` sampled tokens for `--batch` rows of one shared bandit prompt (as
bench_decode.py does), profiles only the decode steps (the prompt is encoded before the
profiler starts), and prints per step:

- the time of each group of ops (weight matmuls, attention, norms and activations, rotary,
  cache writes, sampling, masks and indexing), from the ops' own (self) CPU time;
- the time no op accounts for (Python, dispatch, the sampler's loop over rows, the
  profiler's own cost): the profiled step's wall time minus the sum of every op's self time;
- the `--top` ops by self time.

The weight-read bound (weight bytes / measured read bandwidth) and the matmul compute
bound (2 x parameters x batch / measured fp32 matmul peak) are printed beside the step
time, with the CPU's capability.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from common import bandit_prompt_ids, memory_bandwidth_gbs, seconds
from starpo.compute.flops import measure_matmul_peak
from starpo.models import load_model
from starpo.rollout.backends.base import GenerationRequest, SamplingParams
from starpo.rollout.backends.lean import LeanBackend
from starpo.rollout.backends.linear_kernels import LINEAR_KERNELS

#: Op name -> group. Ops not named here fall in "other".
GROUPS = {
    "weight matmuls": ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"),
    "attention": ("aten::bmm", "aten::_softmax", "aten::softmax", "aten::baddbmm"),
    "norms, activations": ("aten::_fused_rms_norm", "aten::rms_norm", "aten::silu", "aten::mul"),
    "residual adds": ("aten::add", "aten::add_"),
    "rotary": ("aten::cat", "aten::neg"),
    "cache writes, copies": ("aten::copy_", "aten::index_select", "aten::clone"),
    "sampling": (
        "aten::_log_softmax",
        "aten::exp",
        "aten::sum",
        "aten::cumsum",
        "aten::searchsorted",
        "aten::uniform_",
        "aten::gather",
        "aten::div",
        "aten::constant_pad_nd",
        "aten::_local_scalar_dense",
    ),
}
GROUP_OF = {op: group for group, ops in GROUPS.items() for op in ops}


def decode_once(backend: LeanBackend, prompt: list[int], rows: int, tokens: int) -> None:
    backend.reset()
    requests = [GenerationRequest(i, list(prompt)) for i in range(rows)]
    backend.generate(requests, SamplingParams(max_new_tokens=tokens, temperature=1.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--kernel", choices=LINEAR_KERNELS, default="auto", help="the weight matmuls' kernel"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    backend = LeanBackend(
        model, pad_token_id=tokenizer.pad_token_id, weights_dtype=dtype, linear_kernel=args.kernel
    )
    prompt = bandit_prompt_ids(tokenizer, seed=123)
    decode_once(backend, prompt, args.batch, 4)  # warm-up
    plain_ms = (
        (
            seconds(lambda: decode_once(backend, prompt, args.batch, args.tokens))
            - seconds(lambda: decode_once(backend, prompt, args.batch, 1))
        )
        * 1e3
        / (args.tokens - 1)
    )

    # Profile a 1-token call (the prompt's forward and one sample) and a `tokens` call;
    # their difference is exactly the decode steps, per op.
    one_wall, one_ops = profiled(lambda: decode_once(backend, prompt, args.batch, 1))
    wall, ops = profiled(lambda: decode_once(backend, prompt, args.batch, args.tokens))
    steps = args.tokens - 1
    step_ms = (wall - one_wall) / steps
    per_op = {
        k: ((ms - one_ops.get(k, (0.0, 0))[0]) / steps, (n - one_ops.get(k, (0, 0))[1]) / steps)
        for k, (ms, n) in ops.items()
    }
    groups: dict[str, float] = defaultdict(float)
    for key, (ms, _) in per_op.items():
        groups[GROUP_OF.get(key, "other ops")] += ms
    params = sum(p.numel() for p in model.parameters())
    bytes_per = 4 if args.dtype == "fp32" else 2
    bandwidth = memory_bandwidth_gbs()
    peak = measure_matmul_peak(torch.float32)
    read_ms = params * bytes_per / (bandwidth * 1e9) * 1e3
    compute_ms = 2 * params * args.batch / (peak * 1e9) * 1e3
    bound_ms = max(read_ms, compute_ms)
    print(
        f"{args.model} lean {args.dtype} ({backend.numerics.matmul_kernel} matmuls), "
        f"batch {args.batch}, {steps} decode steps, "
        f"{torch.get_num_threads()} threads, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    print(
        f"step {plain_ms:.1f} ms ({step_ms:.1f} under the profiler); "
        f"weight-read bound {read_ms:.1f} ms ({bandwidth:.1f} GB/s), "
        f"compute bound {compute_ms:.1f} ms ({peak:.0f} GFLOP/s): "
        f"{bound_ms / plain_ms:.0%} of max(bound)"
    )
    print(f"{'group':<24}{'ms/step':>9}{'share':>8}")
    unaccounted = step_ms - sum(groups.values())
    rows = sorted(groups.items(), key=lambda kv: -kv[1]) + [("no op (Python etc.)", unaccounted)]
    for name, ms in rows:
        print(f"{name:<24}{ms:>9.2f}{ms / step_ms:>8.0%}")
    print(f"\ntop {args.top} ops by self time (ms/step, calls/step):")
    for key, (ms, calls) in sorted(per_op.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {key:<36}{ms:>8.2f}{calls:>8.0f}")


def profiled(call) -> tuple[float, dict[str, tuple[float, int]]]:
    """Wall ms of `call` under the profiler, and each op's (self ms, calls)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        call()
        wall = (time.perf_counter() - started) * 1e3
    ops = {e.key: (e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()}
    return wall, ops


if __name__ == "__main__":
    main()
