"""Level generation and solver speed, measured side by side in one run.

    python bench/bench_levels.py [--levels 500] [--seed 0]

For each built-in Sokoban id it reports: env resets per second (generation, including the
solver check, as training sees it), the optimal solver's mean time per level on its own,
the solver's share of generation time, and the distribution of optimal solution lengths.
For the other procedurally generated envs (Countdown, Sudoku, 2048, generated qa) it
reports resets per second, the solver's mean time per move and its success over the same
levels, against the random policy's.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from starpo.envs import make
from starpo.envs.policies import make_policy
from starpo.envs.sokoban.env import SokobanEnv
from starpo.envs.sokoban.solver import SokobanSolver

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


#: Generated envs beyond Sokoban, benched by id with their registered defaults.
OTHER_IDS = ("countdown", "countdown-multi", "sudoku", "sudoku-9x9", "2048", "2048-3x3", "qa")


def play(env_id: str, policy_name: str, seeds: range) -> tuple[float, float, int]:
    """(success share, seconds per move choice, moves) of a policy over `seeds`."""
    env, policy = make(env_id), make_policy(policy_name, seed=0)
    wins, moves, choosing = 0, 0, 0.0
    for seed in seeds:
        env.reset(seed=seed)
        while not env.done:
            start = time.perf_counter()
            action = policy(env)
            choosing += time.perf_counter() - start
            *_, info = env.step(action)
            moves += 1
        wins += bool(info["success"])
    return wins / len(seeds), choosing / max(moves, 1), moves


def bench_other(env_id: str, num_levels: int, seed: int) -> dict:
    """Resets per second over `num_levels` seeds, then solver and random play on up to 200."""
    env = make(env_id)
    start = time.perf_counter()
    for i in range(num_levels):
        env.reset(seed=seed + i)
    resets = num_levels / (time.perf_counter() - start)
    seeds = range(seed, seed + min(num_levels, 200))
    solved, move_s, moves = play(env_id, "solver", seeds)
    random_share, _, _ = play(env_id, "random", seeds)
    return {"resets": resets, "solved": solved, "move_ms": 1000 * move_s, "moves": moves,
            "random": random_share, "levels": len(seeds)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, default=500, help="levels per env id")
    parser.add_argument("--seed", type=int, default=10_000, help="first seed")
    args = parser.parse_args()
    import torch  # only for the CPU capability line every benchmark prints

    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()} (pure Python: one core)")
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
    print(f"\n{'id':<17}{'resets/s':>10}{'solver':>8}{'ms/move':>9}{'moves':>7}{'random':>8}")
    for env_id in OTHER_IDS:
        r = bench_other(env_id, args.levels, args.seed)
        print(
            f"{env_id:<17}{r['resets']:>10.0f}{r['solved']:>8.0%}{r['move_ms']:>9.2f}"
            f"{r['moves'] / r['levels']:>7.1f}{r['random']:>8.0%}"
        )
    print("solver / random: success over the first 200 levels; moves: the solver's per level")


if __name__ == "__main__":
    main()
