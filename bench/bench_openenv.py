"""What playing an env over OpenEnv costs: the same random episodes on a local env and on
the same env served by `starpo serve-env` (openenv-core's server, in this process on
127.0.0.1) and played as env id `openenv` (openenv-core's client), side by side.

    python bench/bench_openenv.py [--env sokoban] [--episodes 64] [--concurrency 16]

Prints resets+steps per second for: local, remote one episode at a time, and remote with
`--concurrency` episodes in flight (threads, as the rollout engine's episodes of one turn
are many sessions at once); checks that the remote episodes equal the local ones; and the
CPU capability torch dispatches to. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The tests' server-in-a-thread helper (uvicorn on 127.0.0.1, bounded waits).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))
from serving import running  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="sokoban")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    return p.parse_args()


def play(env, seed: int) -> tuple[list[tuple], int]:
    """A random episode (actions drawn from the seed, never from the env): its observations
    and rewards, and the number of env calls it made."""
    import numpy as np

    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    record, calls, done = [(obs, 0.0)], 1, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(env.sample_action(rng))
        record.append((obs, reward))
        calls, done = calls + 1, terminated or truncated
    return record, calls


def timed(episodes, concurrency: int, make_env) -> tuple[list, float, int]:
    def one(seed: int):
        env = make_env()
        try:
            return play(env, seed)
        finally:
            env.close()

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, episodes))
    seconds = time.perf_counter() - started
    return [r for r, _ in results], seconds, sum(c for _, c in results)


def main() -> None:
    args = parse_args()
    import torch

    from starpo.envs import make
    from starpo.serve.env_server import build_env_app

    app = build_env_app(args.env, max_sessions=max(args.concurrency, 1))
    seeds = list(range(args.episodes))
    with running(app) as url:
        local, local_s, calls = timed(seeds, 1, lambda: make(args.env))
        remote, remote_s, _ = timed(seeds, 1, lambda: make("openenv", url=url))
        many, many_s, _ = timed(seeds, args.concurrency, lambda: make("openenv", url=url))
    print(f"env {args.env}: {args.episodes} random episodes, {calls} env calls (resets + steps)")
    print(f"cpu capability: {torch.backends.cpu.get_cpu_capability()}")
    rows = [("local", local_s), ("openenv, 1 at a time", remote_s)]
    rows.append((f"openenv, {args.concurrency} in flight", many_s))
    for name, seconds in rows:
        ratio = seconds / local_s
        print(f"{name:24s} {calls / seconds:9.0f} calls/s  ({ratio:.1f}x the local time)")
    print(f"remote episodes equal local ones: {remote == local and many == local}")


if __name__ == "__main__":
    main()
