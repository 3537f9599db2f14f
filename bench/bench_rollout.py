"""Rollout throughput with KV-cache reuse vs re-encoding the whole dialogue every turn.

Both runs play the same episodes greedily (identical tokens), side by side in one process,
and the script prints their wall times and the speed-up ratio.

    python bench/bench_rollout.py [--model smollm2-135m-instruct] [--episodes 8] [--turns 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from starpo.models import load_model  # noqa: E402
from starpo.rollout import HFBackend, RolloutEngine, RolloutSettings  # noqa: E402


def timed_rollout(model, tokenizer, reuse_cache: bool, args: argparse.Namespace):
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id, reuse_cache=reuse_cache)
    settings = RolloutSettings(
        max_turns=args.turns, max_new_tokens=args.tokens, temperature=0.0, stop_at_answer=False
    )
    engine = RolloutEngine(backend, tokenizer, settings)
    seeds = list(range(10000, 10000 + args.episodes))
    started = time.perf_counter()
    trajectories = engine.run(args.env, seeds, group_size=1)
    return time.perf_counter() - started, trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per turn")
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    timed_rollout(
        model, tokenizer, True, argparse.Namespace(**{**vars(args), "turns": 1, "episodes": 2})
    )  # warm-up
    reuse_s, reused = timed_rollout(model, tokenizer, True, args)
    full_s, full = timed_rollout(model, tokenizer, False, args)
    same = [t.token_ids for t in reused] == [t.token_ids for t in full]
    turns = sum(len(t.turns) for t in reused)
    tokens = sum(len(t.token_ids) for t in reused)
    print(
        f"{args.model} on {args.env}: {args.episodes} episodes, {turns} turns, "
        f"{tokens} tokens in all, {args.tokens} new tokens per turn"
    )
    print(f"{'mode':<22}{'seconds':>9}{'turns/s':>9}")
    print(f"{'KV cache reused':<22}{reuse_s:>9.2f}{turns / reuse_s:>9.2f}")
    print(f"{'re-encode each turn':<22}{full_s:>9.2f}{turns / full_s:>9.2f}")
    print(f"cache reuse is {full_s / reuse_s:.2f}x faster; identical tokens: {same}")


if __name__ == "__main__":
    main()
