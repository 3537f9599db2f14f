"""Rollout decode speed: generated tokens/s at batch 8 and 32, side by side in one run.

    python bench/bench_decode.py [--batches 8 32] [--tokens 64] [--repeats 3]

Every row shares one bandit prompt (think on, as a GRPO group does) and samples at
temperature 1 without stopping, so each contender generates exactly batch x tokens tokens:

- `model.generate`: transformers' own sampling loop (top_k off), the plain baseline;
- hf fp32: starpo's `HFBackend`, the engine's generation path before the lean backend;
- lean fp32 torch / lean fp32 onednn: `LeanBackend` on the model's fp32 tensors, its
  weight matmuls on PyTorch's `F.linear` / on oneDNN's kernel (the `auto` choice for fp32
  on a CPU, see starpo.rollout.backends.linear_kernels);
- lean bf16: `LeanBackend` with a bf16 weight copy.

Tokens/s count the whole call (prompt encoding included), median of `--repeats`. A
decode step cannot beat either of two bounds, both measured in this run:

- weight-read: a step reads every weight once, so (weight bytes / memory bandwidth), the
  bandwidth from summing a 1 GiB tensor;
- compute: a step multiplies every weight by each row, so (2 x parameters x batch /
  the matmul peak of the contender's dtype, or fp32's where that is higher: on a CPU
  without native bf16 a square bf16 matmul runs at ~1 GFLOP/s, slower than the bf16
  decode step's own small products).

"of bound" is max(the two) over the measured decode step time (the time of a
`tokens`-token call minus a 1-token call, per step). The CPU's capability is printed: on a
CPU without native bf16 the bf16 peak is low and so is lean bf16's speed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from common import bandit_prompt_ids, memory_bandwidth_gbs, seconds
from starpo.compute.flops import measure_matmul_peak
from starpo.models import load_model
from starpo.rollout.backends.base import GenerationRequest, SamplingParams
from starpo.rollout.backends.hf import HFBackend
from starpo.rollout.backends.lean import LeanBackend
from starpo.rollout.backends.linear_kernels import onednn_applies


class Contender:
    """One way to generate `rows` x `tokens` sampled tokens from a shared prompt, with the
    bytes its weights take and the dtype its matmuls run in."""

    def __init__(
        self,
        name: str,
        generate: Callable[[int, int], int],
        weight_bytes: int,
        dtype: torch.dtype = torch.float32,
    ):
        self.name, self.generate, self.weight_bytes = name, generate, weight_bytes
        self.dtype = dtype


def backend_contender(
    name: str, backend, prompt: list[int], weight_bytes: int, dtype: torch.dtype = torch.float32
) -> Contender:
    def generate(rows: int, tokens: int) -> int:
        backend.reset()
        requests = [GenerationRequest(i, list(prompt)) for i in range(rows)]
        params = SamplingParams(max_new_tokens=tokens, temperature=1.0)
        return sum(len(g.token_ids) for g in backend.generate(requests, params))

    return Contender(name, generate, weight_bytes, dtype)


def lean_fp32_kernels() -> list[str]:
    """The matmul kernels lean fp32 can run on here: PyTorch's F.linear, and oneDNN's
    where this build has it (the "auto" choice for fp32 on a CPU)."""
    cpu = torch.device("cpu")
    return ["torch"] + (["onednn"] if onednn_applies(torch.float32, cpu) is None else [])


def lean_fp32_contender(model, pad: int, prompt: list[int], weight_bytes: int, kernel: str):
    backend = LeanBackend(model, pad_token_id=pad, linear_kernel=kernel)
    return backend_contender(f"lean fp32 {kernel}", backend, prompt, weight_bytes)


def hf_generate_contender(model, tokenizer, prompt: list[int], weight_bytes: int) -> Contender:
    def generate(rows: int, tokens: int) -> int:
        ids = torch.tensor([prompt] * rows)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=tokens,
            min_new_tokens=tokens,  # never stop early: the same token count as the others
            pad_token_id=tokenizer.pad_token_id,
        )
        return (out.shape[1] - ids.shape[1]) * rows

    return Contender("model.generate", generate, weight_bytes)


def measure(contender: Contender, rows: int, tokens: int, repeats: int) -> dict[str, float]:
    """Median tokens/s of full calls, and the decode step time (full call minus 1-token)."""
    contender.generate(rows, 4)  # warm-up
    full, first = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        generated = contender.generate(rows, tokens)
        full.append(time.perf_counter() - started)
        first.append(seconds(lambda: contender.generate(rows, 1)))
    assert generated == rows * tokens, f"{contender.name} generated {generated} tokens"
    total = statistics.median(full)
    step = max(total - statistics.median(first), 1e-9) / (tokens - 1)
    return {"tokens_per_s": rows * tokens / total, "step_s": step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    prompt = bandit_prompt_ids(tokenizer, seed=123)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    pad = tokenizer.pad_token_id
    contenders = [
        hf_generate_contender(model, tokenizer, prompt, params * 4),
        backend_contender("hf fp32", HFBackend(model, pad_token_id=pad), prompt, params * 4),
        *[
            lean_fp32_contender(model, pad, prompt, params * 4, kernel)
            for kernel in lean_fp32_kernels()
        ],
        backend_contender(
            "lean bf16",
            LeanBackend(model, pad_token_id=pad, weights_dtype=torch.bfloat16),
            prompt,
            params * 2,
            torch.bfloat16,
        ),
    ]
    bandwidth = memory_bandwidth_gbs()
    dtypes = {torch.float32} | {c.dtype for c in contenders}
    peaks = {dtype: measure_matmul_peak(dtype) for dtype in dtypes}
    print(
        f"{args.model}: {params / 1e6:.0f}M parameters, prompt {len(prompt)} tokens, "
        f"{args.tokens} sampled tokens per row, {torch.get_num_threads()} threads, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}; memory read bandwidth "
        f"{bandwidth:.1f} GB/s; matmul peak "
        + ", ".join(f"{str(d).removeprefix('torch.')} {g:.0f} GFLOP/s" for d, g in peaks.items())
    )
    header = f"{'batch':>5}  {'contender':<16}{'tok/s':>9}{'step ms':>9}"
    print(
        header + f"{'read ms':>9}{'compute ms':>12}{'of bound':>10}{'vs generate':>13}{'vs hf':>8}"
    )
    for rows in args.batches:
        results = {c.name: measure(c, rows, args.tokens, args.repeats) for c in contenders}
        base, hf = results["model.generate"], results["hf fp32"]
        for contender in contenders:
            r = results[contender.name]
            read = contender.weight_bytes / (bandwidth * 1e9)
            # A step in a dtype the CPU emulates could still run at the fp32 peak.
            peak = max(peaks[contender.dtype], peaks[torch.float32])
            compute = 2 * params * rows / (peak * 1e9)
            print(
                f"{rows:>5}  {contender.name:<16}{r['tokens_per_s']:>9.1f}"
                f"{r['step_s'] * 1e3:>9.1f}{read * 1e3:>9.1f}{compute * 1e3:>12.1f}"
                f"{max(read, compute) / r['step_s']:>10.0%}"
                f"{r['tokens_per_s'] / base['tokens_per_s']:>12.2f}x"
                f"{r['tokens_per_s'] / hf['tokens_per_s']:>7.2f}x"
            )


if __name__ == "__main__":
    main()
