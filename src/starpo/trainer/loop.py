"""The StarPO loop. One step, top to bottom (`Trainer.train_step`): rollout, filter,
advantages, update, log; then validate, diagnose and checkpoint (`Trainer.train`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from starpo.algorithms import filter_groups
from starpo.compute.batch import TrainBatch, build_batch
from starpo.compute.weights import (
    export_policy,
    load_trainable_state,
    trainable_parameters,
    trainable_state,
)
from starpo.config import TrainConfig, config_to_dict, save_config
from starpo.diagnostics import ResponseMemory, echo_trap_metrics
from starpo.envs import make
from starpo.errors import UserError
from starpo.logs import console_logger, warn
from starpo.memory import keep_freed_memory, release_free_memory
from starpo.models.precision import compute_dtype, precision_for, rollout_dtype
from starpo.planning import checkpoint_bytes, planned_checkpoint_size
from starpo.registry import GENERATION_BACKENDS
from starpo.rollout.engine import RolloutEngine
from starpo.rollout.evaluate import ModelEvalResult, play_seeds
from starpo.runs import RunFolder
from starpo.timing import TRAIN_MINUTES, Timer, step_train_seconds
from starpo.trainer.budget import STATE_KEY, TrainingBudget, resumed_minutes
from starpo.trainer.checkpoint import (
    capture_rng_state,
    check_free_space,
    check_writable,
    find_resume_point,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
)
from starpo.trainer.collapse import CollapseGuard
from starpo.trainer.models import TrainModels, build_models
from starpo.trainer.optim import Optimizers, build_optimizers
from starpo.trainer.prepare import prepare
from starpo.trainer.saver import OPTIMIZER_KEYS, CheckpointSaver, Target
from starpo.trainer.sinks import RunLogger, format_step_line
from starpo.trainer.update import (
    UPDATE_FLOPS,
    SkipCounter,
    ppo_update,
    update_speed,
)
from starpo.types import Trajectory, by_group

log = console_logger("starpo.trainer")


def rollout_metrics(prefix: str, result: ModelEvalResult) -> dict[str, float]:
    """The episode summary (`starpo.evaluation.summarise`, the keys of `starpo eval`'s
    summary.json) under `prefix`: `train/<env>/success`, `val/<env>/success`, ..."""
    summary = result.summary()
    speed = summary.pop("generation_tokens_per_s")
    out = {f"{prefix}/{k}": float(v) for k, v in summary.items()}
    # A timing, so under perf/ (runs compare exactly on everything but timings).
    out[f"perf/{prefix.split('/')[0]}_generation_tokens_per_s"] = speed
    return out


def group_rewards(trajectories: list[Trajectory]) -> list[list[float]]:
    """Training rewards per env group, in group order (`by_group`)."""
    return [[t.reward for t in group] for group in by_group(trajectories).values()]


def check_env_errors(trajectories: list[Trajectory], max_share: float, step: int) -> int:
    """The number of episodes an env error ended; a UserError when their share passes
    `max_share` or no group is left without one (nothing to train on)."""
    errors = [t for t in trajectories if t.error is not None]
    if not errors:
        return 0
    first = f"first: seed {errors[0].seed}, {errors[0].error}"
    if len(errors) > max_share * len(trajectories):
        raise UserError(
            f"env errors ended {len(errors)} of {len(trajectories)} episodes at step {step}, "
            f"above env.max_error_share={max_share:g} ({first}); fix the env, or raise "
            "env.max_error_share to train on the groups without errors"
        )
    if {t.group for t in errors} == {t.group for t in trajectories}:
        raise UserError(
            f"every env group had an env error at step {step} ({first}); nothing left "
            "to train on: fix the env"
        )
    return len(errors)


class Trainer:
    """Builds models, engines, optimizers and sinks from a config; `train()` runs the loop."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        quiet: bool = False,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        """`model`/`tokenizer`: an already built policy to train instead of loading
        `cfg.model.name` (e.g. a model made in-process); both or neither."""
        from starpo.models import load_model
        from starpo.models.loading import resolve_device

        self.cfg, self.run_dir, self.quiet = cfg, Path(run_dir), quiet
        keep_freed_memory()  # fewer page faults; release_free_memory() after rollouts
        self.folder = RunFolder(self.run_dir)
        check_writable(self.run_dir)  # before any model loads
        make(cfg.env.id, **cfg.env.kwargs)  # bad env ids / kwargs fail before the model loads
        make(cfg.env.validation_id, **cfg.env.validation_kwargs)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.trainer.seed)
        device = resolve_device(cfg.model.device)
        self.precision = precision_for(compute_dtype(cfg.model.dtype, device), device)
        planned = planned_checkpoint_size(cfg) if model is None else None
        if planned is not None:
            check_free_space(self.run_dir, planned)  # from the model's config: before it loads
        if model is None:
            # Loaded in fp32: the master weights; build_models stores frozen ones in bf16.
            model, tokenizer = load_model(cfg.model.name, device=cfg.model.device, dtype="fp32")
        self.models: TrainModels = build_models(cfg, model, tokenizer, self.precision)
        self.optimizers: Optimizers = build_optimizers(cfg, self.models.actor, self.models.critic)
        if planned is None:  # a model passed in, or one whose config the plan cannot read
            check_free_space(self.run_dir, self.checkpoint_estimate())  # before any step
        self.skips = SkipCounter(cfg.optim.max_skipped_updates)
        decode_dtype = rollout_dtype(cfg.rollout.dtype, self.precision.compute_dtype, device)
        self.backend = GENERATION_BACKENDS[cfg.rollout.backend](
            self.models.actor, tokenizer, compute_dtype=decode_dtype
        )
        recompute = cfg.algorithm.recompute_old_logprobs
        # auto: the rollout's log-probs serve as old log-probs only if the backend computes
        # exactly as the update does.
        numerics = self.backend.numerics
        exact = numerics.exact_logprobs
        self.recompute_old_logprobs = (not exact) if recompute is None else recompute
        source = "recomputed in training" if self.recompute_old_logprobs else "the rollout's"
        self.say(
            f"rollouts: {numerics.name} backend in {numerics.compute_dtype} "
            f"({numerics.matmul_kernel} matmuls, {torch.get_num_threads()} threads); "
            f"old log-probs: {source}"
        )
        self.local_backend, self.decode_dtype = self.backend, decode_dtype
        self.train_engine = RolloutEngine(self.backend, tokenizer, cfg.rollout.settings())
        self.val_engine = RolloutEngine(self.backend, tokenizer, self.val_settings)
        self.local_engines = (self.train_engine, self.val_engine)
        self.pool: Any = None  # Ray rollout workers while `train` runs (rollout.workers > 0)
        self.learners: Any = None  # learners 1..N-1 while `train` runs (trainer.learners > 1)
        self.saver = CheckpointSaver(cfg.trainer.checkpoint_async, self.say)
        self.cluster: Any = None
        self.start_step = 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.memory = ResponseMemory()
        self.guard = CollapseGuard(cfg.diagnostics, self.run_dir, self.say, resume=resume)
        self.budget = TrainingBudget(cfg.trainer.max_minutes)  # minutes used: see _resume
        if resume:
            self._resume()
        save_config(cfg, self.folder.config)
        self.logger = RunLogger(
            self.run_dir,
            tensorboard=cfg.trainer.tensorboard,
            wandb=cfg.trainer.wandb,
            wandb_project=cfg.trainer.wandb_project,
            wandb_mode=cfg.trainer.wandb_mode,
            config=config_to_dict(cfg),
            resume=resume,
        )
        if resume:
            self.logger.truncate_after(self.start_step)

    @property
    def val_settings(self):
        return self.cfg.rollout.settings(temperature=self.cfg.trainer.val_temperature)

    def say(self, message: str) -> None:
        """A console line (logger "starpo.trainer"), unless quiet."""
        if not self.quiet:
            log.info(message)

    @property
    def rollbacks(self) -> int:
        return self.guard.rollbacks

    @property
    def alerts(self):  # the run's alert log (alerts.jsonl)
        return self.guard.alerts

    @property
    def policy_version(self) -> int:
        """Optimizer updates applied so far (the schedule counts them; skipped ones not)."""
        return self.optimizers.actor_schedule.last_epoch

    def _seed(self, step: int, purpose: int) -> int:
        """A seed per (run seed, step, purpose): resumed runs sample exactly the same."""
        return (self.cfg.trainer.seed * 1_000_003 + step) * 10 + purpose

    # ------------------------------------------------------------------------- loop
    def train(self, until_step: int | None = None) -> list[dict[str, Any]]:
        """Run the remaining steps (up to `until_step`, default all; fewer when the budget
        trainer.max_minutes is spent); returns the metrics of every step logged in this
        call. The final model is exported after the last step."""
        total, history = self.cfg.trainer.total_steps, []
        last = total if until_step is None else min(until_step, total)
        if self.budget.spent:  # resumed with its budget used up: nothing left to train
            self.say(self.budget.spent_line(self.start_step))
            last = self.start_step
        try:
            self.start_workers()
            if self.start_step == 0 and self.cfg.trainer.val_before_train:
                history.append(self._log(0, self.validate(0)))
            for step in range(self.start_step + 1, last + 1):
                metrics, out_of_time = self._step(step)
                skips = self.skips
                verdict = self.guard.diagnose(step, metrics, skips.limit, skips.consecutive)
                history.append(self._log(step, metrics))
                if self._due(step, self.cfg.trainer.save_every, out_of_time) or step == last:
                    self.save(step, healthy=verdict.state == "healthy")
                if verdict.state == "collapse" and self.on_collapse(step):
                    break
                if out_of_time:
                    self.say(self.budget.stop_line(step))
                    break
            self.wait_for_checkpoint()  # a background write's error stops the run here
            if last == total or self.budget.spent:
                self.export_final()
        finally:
            self.saver.close()  # on an error, still let the write in flight finish
            self.stop_workers()
            self.logger.close()
        return history

    def on_collapse(self, step: int) -> bool:
        """Carry out the guard's decision about a collapse at `step`; True: stop training."""
        action = self.guard.respond(step, self.cfg.trainer.on_collapse)
        if action == "stop":
            self.save(step, healthy=False)
        return action == "stop" or (action == "rollback" and not self._roll_back(step))

    def _roll_back(self, step: int) -> bool:
        """Restore the last healthy checkpoint and go on more conservatively: half the
        learning rates, the guard's config changes. False: nothing to restore."""
        self.wait_for_checkpoint()  # a healthy/ copy may still be written in the background
        healthy = self.guard.rollback_point(step)
        if healthy is None:
            return False
        state = load_checkpoint(healthy)
        # Weights and optimizer moments go back; the schedule keeps its place, at half rate.
        self.load_weights(state, schedules=False)
        self.optimizers.scale_lr(0.5)
        self._apply_config_changes(self.guard.rolled_back(step, state["step"], self.cfg.filter))
        return True

    def _apply_config_changes(self, changes: dict[str, dict[str, Any]]) -> None:
        """Set `{section: {key: value}}` on the live config (a rollback's changes)."""
        for section, values in changes.items():
            for key, value in values.items():
                setattr(getattr(self.cfg, section), key, value)

    def start_workers(self) -> None:
        """With rollout.workers > 0 or trainer.learners > 1: join or start Ray, then start
        the rollout workers (they play every training and validation episode) and the
        other learners, until `stop_workers`."""
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
                self._start_rollout_workers()
            if cfg.trainer.learners > 1:
                self._start_learners()
        except BaseException:
            self.stop_workers()
            raise

    def _start_rollout_workers(self) -> None:
        from starpo.distributed import RolloutPool

        cfg = self.cfg
        self.pool = RolloutPool(
            cfg.rollout.workers,
            self.models.actor,
            self.models.tokenizer,
            backend=cfg.rollout.backend,
            compute_dtype=self.decode_dtype,
            numerics=self.local_backend.numerics,
        )
        self.pool.update_weights(self.models.actor, self.policy_version)
        self.backend = self.pool
        self.train_engine = self.pool.engine(cfg.rollout.settings())
        self.val_engine = self.pool.engine(self.val_settings)
        workers = cfg.rollout.workers
        self.say(
            f"rollouts: {workers} Ray worker{'s' * (workers > 1)} ({self.cluster.address} cluster)"
        )

    def _start_learners(self) -> None:
        from starpo.distributed.learners import Learners

        world = self.cfg.trainer.learners
        self.learners = Learners(
            world, config_to_dict(self.cfg), self.models, self.optimizers, self.cfg.ray.host
        )
        self.say(f"update: {world} data-parallel learners (gloo)")

    def stop_workers(self) -> None:
        """Stop the rollout workers and learners (and a Ray instance started for them);
        rollouts and updates run in-process again."""
        if self.learners is not None:
            self.learners.close()
            self.learners = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
            self.backend = self.local_backend
            self.backend.update_weights(self.models.actor, self.policy_version)
            self.train_engine, self.val_engine = self.local_engines
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def _due(self, step: int, every: int, last_step: bool = False) -> bool:
        """Whether a validation or save every `every` steps falls on `step`, or it is the last."""
        final = last_step or step == self.cfg.trainer.total_steps
        return final or (every > 0 and step % every == 0)

    def _step(self, step: int) -> tuple[dict[str, float], bool]:
        """One step and its validation when due, timed (timing_s/step includes the
        validation); and whether its training time spent the budget (trainer.max_minutes),
        which makes it the last step."""
        timer = Timer()
        with timer("step"):
            metrics = self.train_step(step)
        metrics.update(self.saver.take_cost())  # the previous save's cost, once
        out_of_time = self.budget.charge(step_train_seconds({**metrics, **timer.metrics()}))
        every = self.cfg.trainer.val_every
        if every and self._due(step, every, out_of_time):
            with timer("step"):
                metrics.update(self.validate(step))
        metrics.update(timer.metrics())
        metrics[TRAIN_MINUTES] = self.budget.used_minutes
        return metrics, out_of_time

    def train_step(self, step: int) -> dict[str, float]:
        """One StarPO iteration: rollout -> filter -> advantages -> update; its metrics."""
        timer = Timer()
        with timer("rollout"):
            trajectories, metrics = self.rollout(step)
            release_free_memory()  # the KV cache's pages, before the update's activations
        kept = self.filter(trajectories, metrics)
        with timer("update"):
            batch = self.batch(kept)
            metrics.update(prepare(batch, self.models, self.cfg, self.recompute_old_logprobs))
            metrics.update(self.update(step, batch))
        metrics["perf/tokens_per_s"] = int(batch.attention_mask.sum()) / max(
            timer.seconds["update"], 1e-9
        )
        work = metrics.get(UPDATE_FLOPS, 0.0)
        metrics.update(update_speed(work, timer.seconds["update"], self.models))
        self.logger.log_trajectories(step, trajectories, self.cfg.trainer.log_trajectories)
        return {**metrics, **timer.metrics()}

    def rollout(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Play this step's env groups (fresh seeds) with the current policy."""
        cfg = self.cfg
        first_seed = cfg.rollout.train_seed_start + (step - 1) * cfg.rollout.num_groups
        seeds = list(range(first_seed, first_seed + cfg.rollout.num_groups))
        self.backend.seed(self._seed(step, 1))
        generating = self.train_engine.generation_seconds
        trajectories = self.train_engine.run(
            cfg.env.id, seeds, cfg.rollout.group_size, env_kwargs=cfg.env.kwargs
        )
        generating = self.train_engine.generation_seconds - generating
        metrics = rollout_metrics(f"train/{cfg.env.id}", ModelEvalResult(trajectories, generating))
        metrics["rollout/env_errors"] = check_env_errors(
            trajectories, cfg.env.max_error_share, step
        )
        metrics.update(echo_trap_metrics(trajectories, self.memory))
        self.memory.add(trajectories)
        if self.pool is not None:
            metrics.update(self.pool.metrics())
        return trajectories, metrics

    def filter(self, trajectories: list[Trajectory], metrics: dict[str, float]) -> list[Trajectory]:
        """StarPO-S: keep the groups whose rewards vary most (all groups when off)."""
        cfg = self.cfg.filter
        ratio = cfg.ratio if cfg.enabled else 1.0
        errored = {t.group for t in trajectories if t.error is not None}
        usable = [t for t in trajectories if t.group not in errored]  # see check_env_errors
        result = filter_groups(group_rewards(usable), ratio, cfg.mode)
        metrics["rollout/in_group_std"] = result.std_all
        metrics["rollout/kept_in_group_std"] = result.std_kept
        metrics["rollout/zero_std_groups"] = result.zero_std_groups
        groups = list(by_group(usable))  # group_rewards' order, the one filter_groups counts in
        kept = {groups[i] for i in result.kept}
        chosen = [t for t in usable if t.group in kept]
        metrics["rollout/kept_trajectories"] = len(chosen)
        return chosen

    def batch(self, trajectories: list[Trajectory]) -> TrainBatch:
        """Padded training tensors of the kept trajectories, on the actor's device."""
        batch = build_batch(
            trajectories,
            self.models.tokenizer.pad_token_id,
            per_turn_rewards=self.cfg.algorithm.reward_placement == "per_turn",
        )
        return batch.to(next(self.models.actor.parameters()).device)

    def update(self, step: int, batch: TrainBatch) -> dict[str, float]:
        """PPO epochs over the batch, then hand the new weights to the backend."""
        seed = self._seed(step, 2)
        generator = torch.Generator().manual_seed(seed)
        if self.cfg.trainer.learners > 1 and self.cluster is not None:
            if self.learners is None:  # stopped by a rollback
                self._start_learners()
            metrics = self._update_with_learners(step, batch, generator, seed)
        else:
            models, optimizers = self.models, self.optimizers
            metrics = ppo_update(batch, models, optimizers, self.cfg, generator, self.skips)
        self.backend.update_weights(self.models.actor, self.policy_version)
        metrics["actor/lr"] = self.optimizers.actor.param_groups[0]["lr"]  # the next update's
        if self.optimizers.critic is not None:
            metrics["critic/lr"] = self.optimizers.critic.param_groups[0]["lr"]
        return metrics

    def _update_with_learners(
        self, step: int, batch: TrainBatch, generator: torch.Generator, seed: int
    ) -> dict[str, float]:
        """The update on every learner at once; a lost learner stops the run."""
        from starpo.distributed.cluster import first_line, import_ray

        ray = import_ray()
        try:
            self.learners.start_update(batch, seed)
            metrics = ppo_update(
                batch, self.models, self.optimizers, self.cfg, generator, self.skips,
                sync=self.learners.sync,
            )  # fmt: skip
            self.learners.finish_update()
        except (RuntimeError, ray.exceptions.RayError) as exc:
            # gloo reports a dead peer as a plain RuntimeError ("Connection reset by peer"):
            # without a dead learner, the error is the driver's own and is raised as it is.
            if not isinstance(exc, ray.exceptions.RayError) and not self.learners.any_dead():
                raise
            reason = first_line(exc)[:200]
            saved = latest_checkpoint(self.run_dir)
            last = saved.name if saved is not None else "none yet: it starts over"
            raise UserError(
                f"a learner was lost during the update of step {step} ({reason}); the run "
                f"stops. `starpo train --resume` continues from the last checkpoint ({last})"
            ) from exc
        return metrics

    def validate(self, step: int) -> dict[str, float]:
        cfg, timer = self.cfg.trainer, Timer()
        with timer("validation"):
            self.backend.seed(self._seed(0, 3))  # the same samples every time
            seeds = list(range(cfg.val_seed_start, cfg.val_seed_start + cfg.val_seeds))
            result = play_seeds(
                self.val_engine,
                self.cfg.env.validation_id,
                seeds,
                cfg.val_group_size,
                batch_size=cfg.val_batch_size,
                env_kwargs=self.cfg.env.validation_kwargs,
            )
            self.logger.log_validation_trajectories(step, result.trajectories)
            metrics = rollout_metrics(f"val/{self.cfg.env.validation_id}", result)
            release_free_memory()
        return {**metrics, **timer.metrics()}

    def _log(self, step: int, metrics: dict[str, float]) -> dict[str, Any]:
        self.logger.log(step, metrics)
        train, val = f"train/{self.cfg.env.id}", f"val/{self.cfg.env.validation_id}"
        keys = {
            "success": f"{train}/success",
            "reward": f"{train}/reward",
            "format_ok": f"{train}/format_ok",
            "entropy": "actor/entropy",
            "grad_norm": "actor/grad_norm",
            "val_success": f"{val}/success",
        }
        if self.budget.max_minutes is not None:
            keys["train_min"] = TRAIN_MINUTES
        self.say(format_step_line(step, self.cfg.trainer.total_steps, metrics, keys))
        return {"step": step, **metrics}

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_estimate(self) -> int:
        """`checkpoint_bytes` of the built actor and critic's trainable parameters."""
        modules = [m for m in (self.models.actor, self.models.critic) if m is not None]
        trainable = sum(p.numel() for m in modules for p in trainable_parameters(m))
        return checkpoint_bytes(trainable, self.cfg.trainer.checkpoint_contents)

    def checkpoint_state(self, step: int) -> dict[str, Any]:
        """What a checkpoint holds: the trainable weights (frozen ones and the reference
        model are rebuilt from model.name), AdamW's moments (not with
        trainer.checkpoint_contents=weights), the schedules, RNG, config, diagnostics and
        trainer counters. Live tensors and objects, not copies: a synchronous save writes
        them before the next update, an async one snapshots them."""
        models, guard = self.models, self.guard.state_dict()
        critic = models.critic
        state = {
            "step": step,
            "contents": self.cfg.trainer.checkpoint_contents,
            "actor": trainable_state(models.actor, copy=False),
            "critic": trainable_state(critic, copy=False) if critic is not None else None,
            **self.optimizers.state_dict(),  # optimizers and learning-rate schedules
            "rng": capture_rng_state(),
            "config": config_to_dict(self.cfg),
            "diagnostics": {
                "detector": guard["detector"],
                "memory": self.memory.state_dict(),
                "rollbacks": guard["rollbacks"],
            },
            "trainer_state": {
                "runtime_config": guard["runtime_config"],  # changed by a rollback
                "consecutive_skips": self.skips.consecutive,
                STATE_KEY: self.budget.used_minutes,  # trainer.max_minutes counts across resumes
            },
        }
        if self.cfg.trainer.checkpoint_contents == "weights":
            state.update(dict.fromkeys(OPTIMIZER_KEYS))
        return state

    def save(self, step: int, healthy: bool = True) -> Path:
        """A checkpoint in `checkpoints/`; with `on_collapse=rollback`, a healthy step is also
        kept in `healthy/` (never pruned by newer, possibly collapsing, checkpoints).

        With trainer.checkpoint_async the step waits only for the previous write and for a
        snapshot of the state; the returned folder appears once the background write ends.
        """
        targets = [Target(self.run_dir, self.cfg.trainer.keep_checkpoints)]
        if healthy and self.cfg.trainer.on_collapse == "rollback":
            targets.insert(0, Target(self.folder.healthy, keep=1))
        return self.saver.save(step, self.checkpoint_state, targets)

    def wait_for_checkpoint(self) -> None:
        """Block until the background checkpoint write (if any) has ended; raises its
        error. Anything that reads checkpoints or ends the run calls this first."""
        self.saver.wait()

    def load_weights(self, state: dict[str, Any], schedules: bool = True) -> None:
        """Trainable weights and optimizer state (and the schedules) from a checkpoint.

        A weights-only checkpoint (trainer.checkpoint_contents=weights) restarts AdamW's
        moments, with one warning: the run no longer repeats an unbroken one."""
        load_trainable_state(self.models.actor, state["actor"])
        if self.models.critic is not None:
            load_trainable_state(self.models.critic, state["critic"])
        if state.get("actor_optim") is None:
            warn(
                f"the checkpoint of step {state['step']} holds weights only "
                "(trainer.checkpoint_contents=weights): AdamW's moments restart from zero, "
                "so this run will not repeat an unbroken one",
                "starpo.trainer",
            )
        self.optimizers.load_state_dict(state, schedules=schedules)
        self.backend.update_weights(self.models.actor, self.policy_version)
        if self.learners is not None:  # a rollback: the other learners restart from the
            self.learners.close()  # state the trainer has at its next update (lr changes too)
            self.learners = None

    def _resume(self) -> None:
        state = load_checkpoint(find_resume_point(self.run_dir))
        trainer_state = state.get("trainer_state") or {}
        self.load_weights(state)
        restore_rng_state(state["rng"])
        self.skips.consecutive = int(trainer_state.get("consecutive_skips", 0))
        self.start_step = int(state["step"])
        self.budget.used_minutes = resumed_minutes(trainer_state, self.run_dir, self.start_step)
        diagnostics = state.get("diagnostics") or {}
        if diagnostics:
            self.memory.load_state_dict(diagnostics["memory"])
        guard = {**diagnostics, "runtime_config": trainer_state.get("runtime_config")}
        self._apply_config_changes(self.guard.load_state_dict(guard, self.start_step))
        self.say(f"resumed from step {self.start_step}")

    def export_final(self) -> Path:
        """`run_dir/final/`: the trained policy as a Hugging Face folder (LoRA merged), so
        `starpo eval --policy model --model RUN/final` evaluates it."""
        models = self.models
        return export_policy(models.actor, models.tokenizer, self.folder.final, models.uses_lora)
