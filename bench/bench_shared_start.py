"""An evaluation's rollouts with the system prompt held once: the lean decoder's cache with
one block every row reads, against a copy of it per prompt.

    python bench/bench_shared_start.py [--env invoice] [--cases 64] [--repeats 2]
    python bench/bench_shared_start.py --model runs/invoice/sft   # an SFT policy's replies
    python bench/bench_shared_start.py --cases 8 --group-size 8   # an RL step's rollouts

In an evaluation every case is its own prompt, so no rollouts share one, but all of them
start with the same system message: a tool env's ~500 tokens of tool schemas and rules
(SmolLM2's template), over a third of an invoice dialogue's first prompt. starpo encodes
that common start once either way; the question is what the cache holds afterwards:

- copy per prompt: each row gets its own copy of the start's keys and values, and
  attention reads it once per row at every decode step; first with attention as two
  matmuls around a softmax (the way before 2026-12-07: the ratios' base), then on
  PyTorch's fused attention kernel (parts merged by log-sum-exp);
- one block: every row reads one shared block (`LeanBackend.share_common_start`, the
  default), so a decode step's attention reads it once for all rows;
- with `--bf16-cache`, one block and keys and values in bf16 (`rollout.kv_dtype=bf16`,
  opt-in, inexact): half the bytes for every decode step's attention to read;
- padding dropped: one block, fp32 (and bf16 with `--bf16-cache`), each row's padding
  squeezed out of the cache before every turn's decoding (`LeanBackend.drop_padding`, the
  default since 2026-12-08; the ways above keep it, as the decoder did before).

`--ways 2 4` runs only those ways (0-based, in the order listed; the first is the ratios'
base).

With `--group-size G` the cases are an RL step's groups: G rollouts of each case,
sampled at the preset's temperature from the same seed both ways. A group's case prompt is
one block its rollouts read either way; the question is the system prompt: copied into
every case's block, or a level of its own (a prefix tree: system -> case -> episode), one
block for all rows.

All play the same cases greedily (sampled, with groups) with the env preset's episode
layout, side by side in one process, alternating, `--repeats` times each (the median is
printed). Printed: seconds, generated tokens/s, the ratio, and how many episodes the two
played token for token. The two differ only in the order attention sums its terms: with
fp32 weights, greedy episodes are all the same; sampled ones (groups) agree in log-probs
within ~4e-5 and may part where a draw falls that close to a token's edge (2 of 4 invoice
rollouts parted within 2 turns, after 98 and 141 tokens); with bf16 weights (the default
on a CPU with native bf16) a greedy near-tie may fall either way too.
The CPU's capability and the weights' dtype are printed with them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from starpo.config import load_config
from starpo.models import load_model
from starpo.models.precision import rollout_dtype
from starpo.rollout import RolloutEngine
from starpo.rollout.backends import lean_decoder
from starpo.rollout.backends.lean import LeanBackend

FUSED_KERNEL = lean_decoder._FLASH_CPU
PRESETS = {"invoice": "cpu-invoice-sft-starpo-s", "support": "cpu-support-sft-starpo-s"}


def play(backend: LeanBackend, tokenizer, settings, env: str, seeds: list[int], group: int = 1):
    """(seconds, trajectories) of one pass over `seeds`, `group` rows each, sampled from
    one seed (greedy at temperature 0)."""
    backend.reset()
    backend.seed(0)
    engine = RolloutEngine(backend, tokenizer, settings)
    started = time.perf_counter()
    trajectories = engine.run(env, seeds, group_size=group)
    return time.perf_counter() - started, trajectories


def generated(trajectories) -> int:
    return sum(sum(t.loss_mask) for t in trajectories)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=sorted(PRESETS), default="invoice")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--cases", type=int, default=64, help="cases, decoded in one batch")
    parser.add_argument(
        "--group-size", type=int, default=1,
        help="rollouts of each case (an RL step's groups, sampled); 1: an evaluation",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
        help="the decoder's weights (auto: bf16 on a CPU with native bf16, else fp32)",
    )  # fmt: skip
    parser.add_argument(
        "--bf16-cache", action="store_true",
        help="a third way: one block, keys and values in bf16 (rollout.kv_dtype=bf16)",
    )  # fmt: skip
    parser.add_argument(
        "--ways", type=int, nargs="+", default=None,
        help="indices of the ways to run (default: all; the first is the ratios' base)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cfg = load_config(PRESETS[args.env])
    group = args.group_size
    settings = cfg.rollout.settings(temperature=0.0 if group == 1 else None)
    model, tokenizer = load_model(args.model)
    model.eval()
    dtype = rollout_dtype(args.dtype, torch.float32, torch.device("cpu"))
    backend = LeanBackend(model, pad_token_id=tokenizer.pad_token_id, weights_dtype=dtype)
    seeds = list(range(cfg.trainer.val_seed_start, cfg.trainer.val_seed_start + args.cases))
    how = "greedy" if group == 1 else f"{group} rollouts each at temperature {settings.temperature}"
    print(
        f"{args.env}, {args.cases} cases in one batch, {how}, up to {settings.max_turns} "
        f"turns of {settings.max_new_tokens} tokens; model {args.model}, lean decoder with "
        f"{str(dtype).removeprefix('torch.')} weights; CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}, {args.threads} threads, "
        f"torch {torch.__version__}"
    )
    ways = [
        Way(False, torch.float32, fused=False),
        Way(False, torch.float32),
        Way(True, torch.float32),
        *([Way(True, torch.bfloat16)] if args.bf16_cache else []),
        Way(True, torch.float32, drop_padding=True),
        *([Way(True, torch.bfloat16, drop_padding=True)] if args.bf16_cache else []),
    ]
    if args.ways is not None:
        if not all(0 <= i < len(ways) for i in args.ways):
            raise SystemExit(f"--ways takes indices from 0 to {len(ways) - 1}")
        ways = [ways[i] for i in args.ways]
    Way(True, torch.float32, drop_padding=True).apply(backend)
    play(backend, tokenizer, settings, args.env, seeds[:2], group)  # warm-up: allocator
    times: dict[Way, list[float]] = {way: [] for way in ways}
    played: dict[Way, list] = {}
    for _ in range(args.repeats):
        for way in ways:
            way.apply(backend)
            elapsed, trajectories = play(backend, tokenizer, settings, args.env, seeds, group)
            times[way].append(elapsed)
            played[way] = trajectories
    # Each way's own tokens: episodes that part (sampling, bf16 near-ties) differ in work.
    print(f"{'cache':<50}{'seconds':>9}{'tokens':>8}{'tokens/s':>10}{'ratio':>8}{'same':>6}")
    first = ways[0]
    base = statistics.median(times[first])
    for way in ways:
        median, tokens = statistics.median(times[way]), generated(played[way])
        pairs = list(zip(played[way], played[first], strict=True))
        same = sum(a.token_ids == b.token_ids for a, b in pairs)
        print(
            f"{way.label(group):<50}{median:>9.1f}{tokens:>8}{tokens / median:>10.1f}"
            f"{base / median:>7.2f}x{same:>6}"
        )
    print(
        f"ratio: seconds against the first way's; same: of its {len(played[first])} "
        "episodes, those played token for token as the first way played them"
        + (
            ""
            if dtype == torch.float32
            else " (bf16 weights round each layer's input: a "
            "near-tie the two attention orders break differently changes a greedy token)"
        )
    )


@dataclass(frozen=True)
class Way:
    """How the cache holds the common start, and in which dtype."""

    shared: bool  # one block (a level of its own) against a copy per prompt
    kv_dtype: torch.dtype
    # PyTorch's fused attention kernel, or two matmuls around a softmax (the lean
    # decoder's decode attention before 2026-12-07; its path off the CPU still)
    fused: bool = True
    # Each row's padding squeezed out before every turn's decoding (the default since
    # 2026-12-08), or kept (the decoder's way before)
    drop_padding: bool = False

    def apply(self, backend: LeanBackend) -> None:
        backend.share_common_start = self.shared
        backend.kv_dtype = self.kv_dtype
        backend.drop_padding = self.drop_padding
        lean_decoder._FLASH_CPU = FUSED_KERNEL if self.fused else None

    def label(self, group: int) -> str:
        if group == 1:
            where = "one block for all" if self.shared else "a copy of the start per prompt"
        else:
            where = "two levels: start, case" if self.shared else "the start in each case's block"
        kernel = "" if self.fused else ", two matmuls"
        padding = ", padding dropped" if self.drop_padding else ""
        return f"{where}, {str(self.kv_dtype).removeprefix('torch.')}{kernel}{padding}"


if __name__ == "__main__":
    main()
