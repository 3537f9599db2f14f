"""One decode step's attention, the way the lean decoder runs it, against the ways it could:
the rows' own cached keys and values read for one query row each (grouped-query heads
stacked), at a tool dialogue's length.

    python bench/bench_decode_attention.py [--rows 64] [--columns 1500] [--repeats 20]

Printed per way: milliseconds a call (median), and the key and value bytes it reads a
second against this machine's read bandwidth measured in the same run. Decode attention
reads every cached column once a row, so it is bound by memory: bytes, and how near the
kernel comes to the bandwidth, are the whole story. The ways:

- two matmuls: scores, softmax, weighted values (the lean decoder's path until 2026-12-07);
- fused fp32: PyTorch's fused CPU kernel (`attend_with_lse`, the path now);
- fused bf16: the same kernel on a bf16 cache (`rollout.kv_dtype=bf16`): half the bytes.

The CPU's capability is printed with them. To see the AVX2 code paths on a CPU that has
more, run with `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` (kernels only: the
memory system stays the machine's own).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from common import memory_bandwidth_gbs  # noqa: E402
from starpo.rollout.backends.lean_decoder import attend_with_lse  # noqa: E402

KV_HEADS, GROUP, HEAD_DIM = 3, 3, 64  # SmolLM2-135M: 9 query heads over 3 kv heads


def two_matmuls(q, keys, values, bias):
    scores = torch.matmul(q, keys.transpose(-1, -2)) * HEAD_DIM**-0.5 + bias
    return torch.matmul(scores.softmax(dim=-1), values)


def timed_ms(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="dialogues decoded together")
    parser.add_argument("--columns", type=int, default=1500, help="cached columns a row")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows, columns = args.rows, args.columns
    # Views into buffers with spare room, as the cache hands them out.
    room = columns + columns // 4
    keys = torch.randn(rows, KV_HEADS, room, HEAD_DIM)[:, :, :columns]
    values = torch.randn(rows, KV_HEADS, room, HEAD_DIM)[:, :, :columns]
    q = torch.randn(rows, KV_HEADS, GROUP, HEAD_DIM)
    bias = torch.zeros(rows, 1, GROUP, columns)
    bias[: rows // 4, :, :, : columns // 10] = float("-inf")  # some rows padded
    keys16, values16 = keys.bfloat16(), values.bfloat16()
    bandwidth = memory_bandwidth_gbs()
    print(
        f"decode attention: {rows} rows x {columns} columns, {KV_HEADS} kv heads x {GROUP} "
        f"queries, head dim {HEAD_DIM}; CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, {args.threads} threads, torch "
        f"{torch.__version__}; read bandwidth {bandwidth:.1f} GB/s"
    )
    ways = (
        ("two matmuls, fp32 cache", lambda: two_matmuls(q, keys, values, bias), 4),
        ("fused kernel, fp32 cache", lambda: attend_with_lse(q, keys, values, bias), 4),
        ("fused kernel, bf16 cache", lambda: attend_with_lse(q, keys16, values16, bias), 2),
    )
    print(f"{'way':<28}{'ms':>8}{'GB read':>9}{'GB/s':>7}{'of bw':>7}{'ratio':>7}")
    base = None
    for name, call, item in ways:
        ms = timed_ms(call, args.repeats)
        read = 2 * rows * KV_HEADS * columns * HEAD_DIM * item / 1e9
        base = base or ms
        rate = read / ms * 1e3
        print(
            f"{name:<28}{ms:>8.2f}{read:>9.3f}{rate:>7.1f}{rate / bandwidth:>7.0%}"
            f"{base / ms:>6.2f}x"
        )


if __name__ == "__main__":
    main()
