"""Sokoban level generation and solver speed, measured side by side in one run.

    python bench/bench_levels.py [--levels 500] [--seed 0]

For each built-in Sokoban id it reports: env resets per second (generation, including the
solver check, as training sees it), the optimal solver's mean time per level on its own,
the solver's share of generation time, and the distribution of optimal solution lengths.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from starpo.envs.sokoban import SokobanEnv  # noqa: E402
from starpo.envs.sokoban_solver import SokobanSolver  # noqa: E402

CONFIGS = {  # id -> constructor arguments (as registered in starpo.envs)
    "sokoban": {"dim_room": (6, 6), "num_boxes": 1},
    "sokoban-large": {"dim_room": (8, 8), "num_boxes": 2},
}


def bench_config(kwargs: dict, num_levels: int, seed: int) -> dict:
    """Time `num_levels` resets, then re-solve the same levels with the solver alone."""
    env = SokobanEnv(**kwargs)
    levels = []
    start = time.perf_counter()
    for i in range(num_levels):
        env.reset(seed=seed + i)
        levels.append(env.current_level())
    generate_s = time.perf_counter() - start
    lengths: Counter[int] = Counter()
    start = time.perf_counter()
    for level in levels:
        plan = SokobanSolver(level.walls, level.targets, level.shape).solve(
            level.boxes, level.player, max_depth=env.max_steps
        )
        lengths[len(plan)] += 1
    solve_s = time.perf_counter() - start
    return {
        "levels_per_s": num_levels / generate_s,
        "solver_ms": 1000 * solve_s / num_levels,
        "solver_share": solve_s / generate_s,
        "lengths": lengths,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, default=500, help="levels per env id")
    parser.add_argument("--seed", type=int, default=10_000, help="first seed")
    args = parser.parse_args()
    print(f"{args.levels} levels per id, seeds {args.seed}..{args.seed + args.levels - 1}")
    print(f"{'id':<15}{'levels/s':>10}{'solver ms':>11}{'solver %':>10}{'mean len':>10}")
    results = {}
    for env_id, kwargs in CONFIGS.items():
        r = results[env_id] = bench_config(kwargs, args.levels, args.seed)
        mean = sum(k * v for k, v in r["lengths"].items()) / args.levels
        print(
            f"{env_id:<15}{r['levels_per_s']:>10.0f}{r['solver_ms']:>11.3f}"
            f"{100 * r['solver_share']:>9.1f}%{mean:>10.2f}"
        )
    print("\noptimal solution length: % of levels")
    for env_id, r in results.items():
        total = sum(r["lengths"].values())
        cells = "  ".join(f"{k}:{100 * v / total:.0f}" for k, v in sorted(r["lengths"].items()))
        print(f"  {env_id:<15}{cells}")
    ratio = results["sokoban"]["levels_per_s"] / results["sokoban-large"]["levels_per_s"]
    print(f"\nsokoban generates {ratio:.1f}x as many levels per second as sokoban-large")


if __name__ == "__main__":
    main()
