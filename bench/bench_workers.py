"""Rollout throughput in-process against 1 and 2 Ray rollout workers, side by side.

    python bench/bench_workers.py [--env sokoban] [--groups 8] [--group-size 4]

The same episodes (the Sokoban CPU preset's rollout settings: no think block, one action a
turn, up to 10 turns, sampled at temperature 1 from one seed) are played by:

- in-process: the rollout engine in this process, on all of this machine's cores;
- Ray, 1 worker: one actor with all cores (the cost of going through Ray);
- Ray, 2 workers: two actors with half the cores each, half the env groups each.

Each contender plays once to warm up, then once timed. Printed: episodes, generated tokens,
seconds, tokens/s and the ratio to in-process. Then the weight broadcast a training step
pays (one new policy version: put into the object store once, loaded by every worker):
bytes and seconds, and a simple model of how a step's rollout time scales with workers:

    T(N) ~ broadcast(N) + T(1 worker) / N   (N workers on N machines, groups split evenly)

On one machine the workers share its cores, so 2 workers cannot beat in-process; the
figure that carries over to a cluster is the overhead of Ray against in-process.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from starpo.config import load_config
from starpo.distributed import RolloutPool, connect
from starpo.models import load_model
from starpo.models.precision import rollout_dtype
from starpo.registry import GENERATION_BACKENDS
from starpo.rollout import RolloutEngine


def play(engine, seeds, group_size, seed_backend) -> tuple[float, int, int]:
    """(seconds, episodes, generated tokens) of one timed run after one warm-up run."""
    for _warm_up_then_timed in range(2):
        seed_backend(0)
        started = time.perf_counter()
        trajectories = engine.run("sokoban", seeds, group_size)
        elapsed = time.perf_counter() - started
    tokens = sum(sum(t.loss_mask) for t in trajectories)
    return elapsed, len(trajectories), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="cpu-sokoban-sft-starpo-s")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    cfg = load_config(args.config, [])
    settings = cfg.rollout.settings()
    seeds = list(range(10_000, 10_000 + args.groups))
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    model, tokenizer = load_model(cfg.model.name, dtype="fp32")
    decode = rollout_dtype(cfg.rollout.dtype, torch.float32, model.device)
    backend = GENERATION_BACKENDS[cfg.rollout.backend](model, tokenizer, compute_dtype=decode)
    print(
        f"{args.config}: {args.groups} groups x {args.group_size} episodes, up to "
        f"{settings.max_turns} turns, {cores} cores, decoding in {backend.numerics.compute_dtype}"
    )
    rows = [("in-process", *play(RolloutEngine(backend, tokenizer, settings), seeds,
                                  args.group_size, backend.seed))]  # fmt: skip
    cluster = connect(num_cpus=cores)
    broadcasts = {}
    try:
        for workers in (1, 2):
            started = time.perf_counter()
            pool = RolloutPool(
                workers,
                model,
                tokenizer,
                backend=cfg.rollout.backend,
                compute_dtype=decode,
                numerics=backend.numerics,
            )
            start_s = time.perf_counter() - started
            engine = pool.engine(settings)
            rows.append((f"Ray, {workers} worker{'s' * (workers > 1)}",
                         *play(engine, seeds, args.group_size, pool.seed)))  # fmt: skip
            pool.update_weights(model, 1)  # a new version: what every training step sends
            started = time.perf_counter()
            pool.sync_weights()
            broadcasts[workers] = (pool.broadcast.last_bytes, time.perf_counter() - started)
            print(f"  ({workers} worker(s) started in {start_s:.1f} s)", flush=True)
            pool.close()
    finally:
        cluster.close()

    base = rows[0][3] / rows[0][1]
    print(f"\n{'rollouts':<16}{'episodes':>9}{'tokens':>8}{'seconds':>9}{'tok/s':>8}{'ratio':>7}")
    for name, elapsed, episodes, tokens in rows:
        rate = tokens / elapsed
        print(f"{name:<16}{episodes:>9}{tokens:>8}{elapsed:>9.1f}{rate:>8.1f}{rate / base:>7.2f}")
    print(f"\n{'broadcast':<16}{'MB':>9}{'seconds':>9}")
    for workers, (size, elapsed) in broadcasts.items():
        print(f"{f'{workers} worker(s)':<16}{size / 2**20:>9.1f}{elapsed:>9.2f}")
    one = rows[1][1]
    print("\nModel, N workers on N machines (this run's 1-worker time and broadcast):")
    per_worker_broadcast = broadcasts[2][1] / 2
    for n in (1, 2, 4, 8):
        estimate = broadcasts[1][1] + per_worker_broadcast * (n - 1) + one / n
        print(f"  N={n}: ~{estimate:.1f} s per rollout stage (in-process here: {rows[0][1]:.1f} s)")


if __name__ == "__main__":
    main()
