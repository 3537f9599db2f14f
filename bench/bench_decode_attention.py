"""One decode step's attention, the way the lean decoder runs it, against the ways it could:
the rows' own cached keys and values read for one query row each (grouped-query heads
stacked), at a tool dialogue's length.

    python bench/bench_decode_attention.py [--rows 64] [--columns 1500] [--repeats 20]

Printed per way: milliseconds a call (median), and the key and value bytes it reads a
second against this machine's read bandwidth measured in the same run. Decode attention
reads every cached column once a row, so it is bound by memory: bytes, and how near the
kernel comes to the bandwidth, are the whole story. The ways:

- two matmuls: scores, softmax, weighted values (the lean decoder's path until 2026-12-07);
- tall matmuls: the same turned around (keys times the queries, a T x M product, then the
  probabilities' transpose times the values), a shape BLAS may run better for M = 3;
- fused fp32: PyTorch's fused CPU kernel (`attend_with_lse`, the path now);
- fused bf16: the same kernel on a bf16 cache (`rollout.kv_dtype=bf16`): half the bytes.

A second table times one decode step of an RL step's prompt tree (`--groups` cases, each
read by rows / groups rollouts, under one system prompt): a system block read by every
row, a case block a group, then each row's own columns (`--system`, `--case`, `--own`;
by default an invoice dialogue late in its turns with JSON tool schemas):

- copied: every row's shared columns copied in front of its own, one fused call (the
  cost of a tree that is not shared);
- block by block: each block once for the rows that read it, one call a block, then the
  rows' own columns, merged by log-sum-exp (the lean decoder's path until 2026-12-08);
- one call a level: `attend_parts`, as the lean decoder runs it now: a level's blocks are
  the batch entries of one call, their readers stacked as query rows;
- own columns only: the parts' last call alone (what the shared blocks and the merge add
  to it is the rest).

The CPU's capability is printed with them. To see the AVX2 code paths on a CPU that has
more, run with `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` (kernels only: the
memory system stays the machine's own).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from common import memory_bandwidth_gbs
from starpo.rollout.backends.lean_decoder import (
    SharedPart,
    attend_parts,
    attend_with_lse,
    level_reads,
    merge_parts,
)
from starpo.rollout.backends.lean_kv_store import SharedLevel

KV_HEADS, GROUP, HEAD_DIM = 3, 3, 64  # SmolLM2-135M: 9 query heads over 3 kv heads


def two_matmuls(q, keys, values, bias):
    scores = torch.matmul(q, keys.transpose(-1, -2)) * HEAD_DIM**-0.5 + bias
    return torch.matmul(scores.softmax(dim=-1), values)


def tall_matmuls(q, keys, values, bias):
    """The same two matmuls turned around: keys (T x D) times the few queries (D x M), a
    tall, thin product, then the probabilities' transpose times the values."""
    scores = torch.matmul(keys, q.transpose(-1, -2)) * HEAD_DIM**-0.5 + bias.transpose(-1, -2)
    return torch.matmul(scores.softmax(dim=-2).transpose(-1, -2), values)


def timed_ms(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def random_cache(blocks: int, columns: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(blocks, KV_HEADS, columns, HEAD_DIM).to(dtype)


def block_by_block(grouped, levels, parts, keys, values, own_bias) -> torch.Tensor:
    """The prompt tree's attention one call a block (the decoder's until 2026-12-08)."""
    rows, kv_heads, queries, dim = grouped.shape
    outs, lses = [], []
    for level, part in zip(levels, parts, strict=True):
        out = grouped.new_empty(rows, kv_heads, queries, dim)
        lse = grouped.new_empty(rows, kv_heads, queries)
        for block, members in level.groups():
            bias = part.read.bias[block : block + 1]  # every block has the same readers here
            stacked = grouped[members].transpose(0, 1).reshape(1, kv_heads, -1, dim)
            block_out, block_lse = attend_with_lse(
                stacked, part.keys[block][None], part.values[block][None], bias
            )
            shape = (kv_heads, len(members), queries)
            out[members] = block_out.view(*shape, dim).transpose(0, 1)
            lse[members] = block_lse.view(shape).transpose(0, 1)
        outs.append(out)
        lses.append(lse)
    own_out, own_lse = attend_with_lse(grouped, keys, values, own_bias)
    return merge_parts([*outs, own_out], [*lses, own_lse])


def tree_ways(args: argparse.Namespace, dtype: torch.dtype) -> list[tuple[str, Callable, int]]:
    """(name, call, columns read) of each way through one prompt-tree decode step."""
    rows, groups = args.rows, args.groups
    system, case, own = args.system, args.case, args.own
    q = torch.randn(rows, KV_HEADS * GROUP, 1, HEAD_DIM)
    grouped = q.reshape(rows, KV_HEADS, GROUP, HEAD_DIM)
    first = torch.zeros(rows, dtype=torch.long)
    of_case = torch.arange(groups).repeat_interleave(rows // groups)
    levels = [
        SharedLevel([random_cache(1, system, dtype)], [random_cache(1, system, dtype)], first),
        SharedLevel([random_cache(groups, case, dtype)], [random_cache(groups, case, dtype)],
                    of_case),
    ]  # fmt: skip
    room = own + own // 4  # views into buffers with spare room, as the cache has them
    keys = random_cache(rows, room, dtype)[:, :, :own]
    values = random_cache(rows, room, dtype)[:, :, :own]
    bias = torch.zeros(rows, 1, GROUP, system + case + own)
    parts = [
        SharedPart(level.keys[0], level.values[0], level_read)
        for level, level_read in zip(levels, level_reads(levels, bias), strict=True)
    ]
    own_bias = bias[..., system + case :]
    copied = [
        torch.cat([level[0][rows_of] for level, rows_of in ((levels[0].keys, first),
                   (levels[1].keys, of_case))] + [keys], dim=2),
        torch.cat([level[0][rows_of] for level, rows_of in ((levels[0].values, first),
                   (levels[1].values, of_case))] + [values], dim=2),
    ]  # fmt: skip
    return [
        (
            "copied, one call",
            lambda: attend_with_lse(grouped, copied[0], copied[1], bias),
            rows * (system + case + own),
        ),
        (
            "block by block",
            lambda: block_by_block(grouped, levels, parts, keys, values, own_bias),
            system + groups * case + rows * own,
        ),
        (
            "one call a level",
            lambda: attend_parts(q, KV_HEADS, keys, values, own_bias, parts),
            system + groups * case + rows * own,
        ),
        (
            "own columns only",
            lambda: attend_with_lse(grouped, keys, values, own_bias),
            rows * own,
        ),
    ]


def print_tree_table(args: argparse.Namespace, bandwidth: float) -> None:
    """The prompt-tree table (module doc), for an fp32 and a bf16 cache."""
    if args.rows % args.groups:
        raise SystemExit(f"--rows {args.rows} must be a multiple of --groups {args.groups}")
    print(
        f"\nprompt tree: {args.rows} rows = {args.groups} cases x {args.rows // args.groups}; "
        f"system {args.system} + case {args.case} + own {args.own} columns a row"
    )
    print(f"{'way':<30}{'ms':>8}{'GB read':>9}{'GB/s':>7}{'of bw':>7}{'ratio':>7}")
    for dtype, cache in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        per_column = 2 * KV_HEADS * HEAD_DIM * dtype.itemsize / 1e9
        base = None
        for name, call, columns in tree_ways(args, dtype):
            ms = timed_ms(call, args.repeats)
            read = columns * per_column
            base = base or ms
            rate = read / ms * 1e3
            print(
                f"{name + ', ' + cache:<30}{ms:>8.2f}{read:>9.3f}{rate:>7.1f}"
                f"{rate / bandwidth:>7.0%}{base / ms:>6.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="dialogues decoded together")
    parser.add_argument("--columns", type=int, default=1500, help="cached columns a row")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--groups", type=int, default=8, help="cases in the prompt tree")
    parser.add_argument("--system", type=int, default=661, help="system prompt columns")
    parser.add_argument("--case", type=int, default=485, help="a case prompt's columns")
    parser.add_argument("--own", type=int, default=600, help="a row's own columns")
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
        ("tall matmuls, fp32 cache", lambda: tall_matmuls(q, keys, values, bias), 4),
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
    print_tree_table(args, bandwidth)


if __name__ == "__main__":
    main()
