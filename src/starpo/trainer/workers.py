"""Where a run's rollouts and updates execute: in-process, or (while `Trainer.train` runs,
with rollout.workers > 0 or trainer.learners > 1) on Ray rollout workers and
data-parallel learners. The trainer asks this object for the backend and engines of the
moment instead of swapping its own attributes: they follow from whether a pool is up."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from starpo.compute.batch import TrainBatch
from starpo.config import TrainConfig, config_to_dict
from starpo.config.episode import EpisodeSettings
from starpo.errors import UserError
from starpo.models.loading import resolve_dtype
from starpo.rollout.backends.base import set_kv_dtype, set_share_histories
from starpo.rollout.engine import RolloutEngine
from starpo.trainer.checkpoints.store import latest_checkpoint
from starpo.trainer.optim import Optimizers
from starpo.trainer.train_models import TrainModels
from starpo.trainer.update import SkipCounter, ppo_update
from starpo.trainer.update_settings import UpdateSettings


class Workers:
    """The in-process backend and engines, and the Ray pool, learners and cluster that
    replace them between `start` and `stop`."""

    def __init__(
        self,
        cfg: TrainConfig,
        models: TrainModels,
        backend: Any,
        decode_dtype: torch.dtype,
        settings: tuple[EpisodeSettings, EpisodeSettings],
        say: Callable[[str], None],
    ) -> None:
        """`backend`: the in-process generation backend; `settings`: the training and the
        validation episodes' settings."""
        self.cfg, self.models, self.say = cfg, models, say
        self.local_backend, self.decode_dtype, self.settings = backend, decode_dtype, settings
        set_share_histories(backend, cfg.rollout.share_histories)
        self.kv_dtype = resolve_dtype(cfg.rollout.kv_dtype, torch.device("cpu"))
        set_kv_dtype(backend, self.kv_dtype)
        tokenizer = models.tokenizer
        self.local_engines = tuple(RolloutEngine(backend, tokenizer, s) for s in settings)
        self.pool: Any = None  # Ray rollout workers while `train` runs (rollout.workers > 0)
        self.pool_engines: tuple[Any, Any] | None = None
        self.learners: Any = None  # learners 1..N-1 while `train` runs (trainer.learners > 1)
        self.cluster: Any = None

    # ------------------------------------------------------------- what runs now
    @property
    def backend(self) -> Any:
        """The backend rollouts generate with now: the pool's, else the local one."""
        return self.pool if self.pool is not None else self.local_backend

    @property
    def train_engine(self) -> Any:
        return (self.pool_engines or self.local_engines)[0]

    @property
    def val_engine(self) -> Any:
        return (self.pool_engines or self.local_engines)[1]

    @property
    def distributed_update(self) -> bool:
        return self.cfg.trainer.learners > 1 and self.cluster is not None

    # ---------------------------------------------------------------- lifecycle
    def start(self, optimizers: Optimizers, policy_version: int) -> None:
        """With rollout.workers > 0 or trainer.learners > 1: join or start Ray, then start
        the rollout workers (they play every training and validation episode) and the
        other learners, until `stop`."""
        cfg = self.cfg
        if (not cfg.rollout.workers and cfg.trainer.learners == 1) or self.cluster is not None:
            return
        from starpo.distributed import connect

        ray_cfg = cfg.ray
        self.cluster = connect(
            ray_cfg.address,
            num_cpus=ray_cfg.num_cpus,
            host=ray_cfg.host,
            dashboard=ray_cfg.dashboard,
        )
        try:
            if cfg.rollout.workers:
                self._start_rollout_workers(policy_version)
            if cfg.trainer.learners > 1:
                self.start_learners(optimizers)
        except BaseException:
            self.stop(policy_version)
            raise

    def _start_rollout_workers(self, policy_version: int) -> None:
        from starpo.distributed import RolloutPool

        cfg = self.cfg
        self.pool = RolloutPool(
            cfg.rollout.workers,
            self.models.actor,
            self.models.tokenizer,
            backend=cfg.rollout.backend,
            compute_dtype=self.decode_dtype,
            numerics=self.local_backend.numerics,
            share_histories=cfg.rollout.share_histories,
            kv_dtype=self.kv_dtype,
        )
        self.pool.update_weights(self.models.actor, policy_version)
        self.pool_engines = tuple(self.pool.engine(s) for s in self.settings)
        workers = cfg.rollout.workers
        self.say(
            f"rollouts: {workers} Ray worker{'s' * (workers > 1)} ({self.cluster.address} cluster)"
        )

    def start_learners(self, optimizers: Optimizers) -> None:
        """Learners 1..N-1, starting from the trainer's current weights and optimizer."""
        from starpo.trainer.learners import Learners

        world = self.cfg.trainer.learners
        self.learners = Learners(
            world, config_to_dict(self.cfg), self.models, optimizers, self.cfg.ray.host
        )
        self.say(f"update: {world} data-parallel learners (gloo)")

    def stop_learners(self) -> None:
        if self.learners is not None:
            self.learners.close()
            self.learners = None

    def stop(self, policy_version: int) -> None:
        """Stop the rollout workers and learners (and a Ray instance started for them);
        rollouts and updates run in-process again, on the current weights."""
        self.stop_learners()
        if self.pool is not None:
            self.pool.close()
            self.pool, self.pool_engines = None, None
            self.local_backend.update_weights(self.models.actor, policy_version)
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    # ------------------------------------------------------------------- update
    def update_with_learners(
        self,
        step: int,
        batch: TrainBatch,
        optimizers: Optimizers,
        generator: torch.Generator,
        seed: int,
        skips: SkipCounter,
        run_dir: Path,
    ) -> dict[str, float]:
        """The update on every learner at once; a lost learner stops the run."""
        from starpo.distributed.cluster import first_line, import_ray

        if self.learners is None:  # stopped by a rollback
            self.start_learners(optimizers)
        ray = import_ray()
        try:
            self.learners.start_update(batch, seed)
            metrics = ppo_update(
                batch, self.models, optimizers, UpdateSettings.of(self.cfg), generator, skips,
                sync=self.learners.sync,
            )  # fmt: skip
            self.learners.finish_update()
        except (RuntimeError, ray.exceptions.RayError) as exc:
            # gloo reports a dead peer as a plain RuntimeError ("Connection reset by peer"):
            # without a dead learner, the error is the driver's own and is raised as it is.
            if not isinstance(exc, ray.exceptions.RayError) and not self.learners.any_dead():
                raise
            reason = first_line(exc)[:200]
            saved = latest_checkpoint(run_dir)
            last = saved.name if saved is not None else "none yet: it starts over"
            raise UserError(
                f"a learner was lost during the update of step {step} ({reason}); the run "
                f"stops. `starpo train --resume` continues from the last checkpoint ({last})"
            ) from exc
        return metrics
