"""Rollout workers on Ray: each actor owns its envs and a replica of the policy.

Who holds what:
- the driver (the trainer process) holds the training model and the optimizer; after an
  update it puts the trainable weights into Ray's object store once per version;
- each `RolloutWorker` actor holds a policy replica, a generation backend and an engine per
  rollout settings; it loads a new version only when the version changed, from the one
  object-store reference all workers share (no copy per episode or per worker);
- `RolloutPool` splits a step's env groups into contiguous chunks, one per worker, and
  gathers the trajectories in group order, as the in-process engine returns them.

A chunk samples from a seed derived from the step's seed and the chunk's first group, so
which worker plays it does not matter; with one worker the chunk is the whole batch and
the seed is the step's own: sampled trajectories equal the in-process engine's. Greedy
decoding gives the same trajectories for any number of workers (tested).

A worker that dies mid-step (its process killed, its node lost) is replaced by a fresh
actor, which gets the current weights, and its chunk runs again there; the step completes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from starpo.config.episode import EpisodeSettings
from starpo.distributed.cluster import (
    first_line,
    import_ray,
    require_free_cpus,
    ship_with_code,
    wait_started,
)
from starpo.errors import UserError
from starpo.types import Trajectory

log = logging.getLogger("starpo.distributed")

#: Attempts at one chunk before the step fails (each after replacing a dead worker).
MAX_CHUNK_ATTEMPTS = 3


def split_groups(num_groups: int, num_workers: int) -> list[range]:
    """Contiguous, near-equal ranges of group indices, one per worker that gets any."""
    workers = min(num_workers, num_groups)
    base, extra = divmod(num_groups, workers)
    ranges, start = [], 0
    for i in range(workers):
        size = base + (i < extra)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def chunk_seed(step_seed: int, first_group: int) -> int:
    """The sampling seed of the chunk starting at `first_group`: the step's own for the
    first chunk (so one worker samples exactly as the in-process engine)."""
    return (step_seed + 1_000_003 * first_group) % (2**63)


class RolloutWorker:
    """The body of one Ray actor (wrapped with `ray.remote` by `RolloutPool`)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        build_backend: Callable[..., Any],
        compute_dtype: Any,
        threads: int,
        share_histories: bool = False,
        kv_dtype: Any = None,
    ) -> None:
        """`build_backend`: the backend's factory itself, resolved on the driver (a backend
        registered there at run time is one the worker's own registry never saw)."""
        import torch

        from starpo.rollout.backends.base import set_kv_dtype, set_share_histories

        torch.set_num_threads(threads)
        self.model, self.tokenizer = model.eval(), tokenizer
        self.backend = build_backend(self.model, tokenizer, compute_dtype=compute_dtype)
        set_share_histories(self.backend, share_histories)
        set_kv_dtype(self.backend, kv_dtype or torch.float32)
        self.version = -1
        self.engines: dict[EpisodeSettings, Any] = {}

    def ready(self) -> int:
        return os.getpid()

    def set_weights(self, version: int, state: dict[str, Any]) -> int:
        """Load trainable tensors of policy `version` (skipped when already loaded)."""
        if version != self.version:
            from starpo.compute.weights import load_trainable_state

            load_trainable_state(self.model, state)
            self.backend.update_weights(self.model, version)
            self.version = version
        return self.version

    def run(
        self,
        settings: EpisodeSettings,
        env_specs: list[Any],
        env_id: str,
        seeds: list[int],
        group_size: int,
        env_kwargs: dict[str, Any],
        seed: int,
        starts: list[Any] | None = None,
    ) -> list[Trajectory]:
        """Play the chunk (the pool times the parallel run itself, wall clock)."""
        from starpo.envs.registry import register
        from starpo.rollout.engine import RolloutEngine

        for spec in env_specs:  # envs registered at run time in the driver exist here too
            register(spec.id, spec.entry_point, kwargs=spec.kwargs, overwrite=True)
        if settings not in self.engines:
            self.engines[settings] = RolloutEngine(self.backend, self.tokenizer, settings)
        engine = self.engines[settings]
        self.backend.seed(seed)
        return engine.run(env_id, seeds, group_size, env_kwargs=env_kwargs, starts=starts)


@dataclass
class BroadcastStats:
    """What sending weights cost: per-version bytes and seconds (put + every worker load)."""

    versions_sent: int = 0
    last_bytes: int = 0
    last_seconds: float = 0.0


class RolloutPool:
    """N rollout actors behind the calls the trainer makes of a backend: a
    `starpo.rollout.backends.base.PolicySampler` (`seed`, `update_weights`, `numerics`), plus an
    `EpisodePlayer` per rollout settings (`engine`)."""

    def __init__(
        self,
        num_workers: int,
        model: Any,
        tokenizer: Any,
        *,
        backend: str,
        compute_dtype: Any,
        numerics: Any,
        threads: int | None = None,
        share_histories: bool = False,
        kv_dtype: Any = None,
    ) -> None:
        if num_workers < 1:
            raise UserError(f"rollout.workers must be >= 1 for a pool, got {num_workers}")
        ray = import_ray()
        self.numerics = numerics
        self.num_workers = num_workers
        self.threads = threads or max(1, (os.cpu_count() or 1) // num_workers)
        # One object holds the replica's architecture and starting weights; every worker
        # (and every replacement) builds from that reference.
        require_free_cpus(
            num_workers, f"rollout.workers={num_workers}", "set fewer rollout.workers"
        )
        from starpo.registry import GENERATION_BACKENDS

        build = GENERATION_BACKENDS[backend]
        ship_with_code(build)  # a backend defined in the user's own code reaches the workers
        self._init_args = (
            ray.put(model),
            tokenizer,
            build,
            compute_dtype,
            self.threads,
            share_histories,
            kv_dtype,
        )
        # One CPU each, so Ray spreads workers over a cluster's nodes.
        self._actor_class = ray.remote(num_cpus=1)(RolloutWorker)
        self.workers = [self._start_worker() for _ in range(num_workers)]
        try:
            wait_started([w.ready.remote() for w in self.workers], "the rollout workers")
        except BaseException:
            self.close()  # no actor of a failed start outlives it
            raise
        self._step_seed = 0
        self._model, self._version = model, 0
        self._weights: tuple[int, Any] | None = None  # (version, object ref) last put
        self._worker_versions = [-1] * num_workers
        self.broadcast = BroadcastStats()
        self.restarts = 0

    # ------------------------------------------------------------------ backend calls
    def seed(self, seed: int) -> None:
        self._step_seed = seed

    def update_weights(self, model: Any, version: int) -> None:
        """Remember the new version; it is sent at the next run, once (not per update
        when several updates come between two rollouts)."""
        self._model, self._version = model, version

    def metrics(self) -> dict[str, float]:
        """The cost of the last weight broadcast (timings under perf/) and the restarts."""
        return {
            "perf/weight_broadcast_mb": self.broadcast.last_bytes / 2**20,
            "perf/weight_broadcast_s": self.broadcast.last_seconds,
            "rollout/worker_restarts": float(self.restarts),
        }

    def engine(self, settings: EpisodeSettings) -> PoolEngine:
        return PoolEngine(self, settings)

    def close(self) -> None:
        ray = import_ray()
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []

    # ------------------------------------------------------------------ internals
    def _start_worker(self) -> Any:
        return self._actor_class.remote(*self._init_args)

    def _weights_ref(self) -> Any:
        """The object-store reference of the current version's trainable weights."""
        ray = import_ray()
        if self._weights is None or self._weights[0] != self._version:
            from starpo.compute.weights import trainable_state

            started = time.perf_counter()
            state = trainable_state(self._model)
            self._weights = (self._version, ray.put(state))
            self.broadcast.versions_sent += 1
            self.broadcast.last_bytes = sum(t.numel() * t.element_size() for t in state.values())
            self.broadcast.last_seconds = time.perf_counter() - started
        return self._weights[1]

    def sync_weights(self) -> None:
        """Send the current version to every worker that lacks it; wait for the loads."""
        ray = import_ray()
        ref, started = self._weights_ref(), time.perf_counter()
        stale = [i for i, v in enumerate(self._worker_versions) if v != self._version]
        versions = ray.get([self.workers[i].set_weights.remote(self._version, ref) for i in stale])
        for i, version in zip(stale, versions, strict=True):
            self._worker_versions[i] = version
        if stale:
            self.broadcast.last_seconds += time.perf_counter() - started

    def _replace_worker(self, index: int, error: Exception) -> None:
        ray = import_ray()
        reason = first_line(error)[:200]
        log.warning("rollout worker %d died (%s); starting a replacement", index, reason)
        try:
            ray.kill(self.workers[index])
        except Exception:  # noqa: BLE001 - already gone is the expected case
            pass
        self.workers[index] = self._start_worker()
        self._worker_versions[index] = -1
        self.restarts += 1

    def run(
        self,
        settings: EpisodeSettings,
        env_id: str,
        seeds: list[int],
        group_size: int,
        env_kwargs: dict[str, Any],
        starts: list[Any] | None = None,
    ) -> tuple[list[Trajectory], float]:
        """Play every seed's group across the workers (from `starts` where given, see
        `EpisodePlayer.run`); trajectories in group order, and the wall-clock seconds of
        the parallel generation."""
        ray = import_ray()
        from starpo.envs.registry import spec

        specs = [spec(env_id)]  # a worker registers it: envs registered at run time included
        if callable(specs[0].entry_point):
            ship_with_code(specs[0].entry_point)
        chunks = split_groups(len(seeds), self.num_workers)
        results: dict[int, list[Trajectory]] = {}
        attempts = dict.fromkeys(range(len(chunks)), 0)
        started = time.perf_counter()
        pending = list(range(len(chunks)))
        while pending:
            self.sync_weights()
            futures = {}
            for chunk in pending:
                groups = chunks[chunk]
                worker = self.workers[chunk % self.num_workers]
                futures[chunk] = worker.run.remote(
                    settings,
                    specs,
                    env_id,
                    [seeds[g] for g in groups],
                    group_size,
                    env_kwargs,
                    chunk_seed(self._step_seed, groups.start),
                    None if starts is None else [starts[g] for g in groups],
                )
            pending = []
            for chunk, future in futures.items():
                try:
                    trajectories = ray.get(future)
                except ray.exceptions.RayActorError as exc:
                    attempts[chunk] += 1
                    if attempts[chunk] >= MAX_CHUNK_ATTEMPTS:
                        raise RuntimeError(
                            f"rollout chunk {chunk} failed {attempts[chunk]} times; its worker "
                            f"died each time: {exc}"
                        ) from exc
                    self._replace_worker(chunk % self.num_workers, exc)
                    pending.append(chunk)
                    continue
                first = chunks[chunk].start
                results[chunk] = [replace(t, group=t.group + first) for t in trajectories]
        ordered = [t for chunk in range(len(chunks)) for t in results[chunk]]
        return ordered, time.perf_counter() - started


class PoolEngine:
    """The pool as an `starpo.rollout.engine.EpisodePlayer` with fixed settings (what the
    trainer and `play_seeds` call): `run(...)` and a running `generation_seconds`."""

    def __init__(self, pool: RolloutPool, settings: EpisodeSettings) -> None:
        self.pool, self.settings = pool, settings
        self.generation_seconds = 0.0

    def run(
        self,
        env_id: str,
        seeds: list[int],
        group_size: int,
        *,
        env_kwargs: dict[str, Any] | None = None,
        on_turn: Callable[[int], None] | None = None,
        starts: list[Any] | None = None,
    ) -> list[Trajectory]:
        """`on_turn` is called once, after the last turn: turns run inside the workers."""
        trajectories, seconds = self.pool.run(
            self.settings, env_id, seeds, group_size, env_kwargs or {}, starts
        )
        self.generation_seconds += seconds
        if on_turn is not None:
            on_turn(self.settings.max_turns)
        return trajectories
