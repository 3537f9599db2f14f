"""The StarPO loop. One step, top to bottom (`Trainer.train_step`): rollout, filter,
advantages, update, log; then validate, diagnose and checkpoint (`Trainer.train`)."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from starpo.compute.batch import TrainBatch, build_batch
from starpo.compute.cpu_sharing import check_cpu_sharing
from starpo.compute.weights import (
    export_policy,
    trainable_parameters,
)
from starpo.config import TrainConfig, apply_changes, config_to_dict, save_config
from starpo.diagnostics import ResponseMemory, echo_trap_metrics
from starpo.envs import make
from starpo.evaluation.model import play_seeds
from starpo.logs import console_logger, warn
from starpo.memory.allocator import keep_freed_memory, release_free_memory
from starpo.memory.plan import checkpoint_bytes, planned_checkpoint_size
from starpo.models.precision import compute_dtype, precision_for, rollout_dtype
from starpo.registry import GENERATION_BACKENDS
from starpo.runs import RunFolder
from starpo.timing import TRAIN_MINUTES, Timer, step_train_seconds, time_left
from starpo.trainer.budget import TrainingBudget
from starpo.trainer.checkpoints.contents import checkpoint_contents, restore_training_state
from starpo.trainer.checkpoints.saver import CheckpointSaver, Target
from starpo.trainer.checkpoints.store import (
    check_free_space,
    check_writable,
    find_resume_point,
    load_checkpoint,
    restore_rng_state,
)
from starpo.trainer.collapse import CollapseGuard
from starpo.trainer.curriculum import Curriculum
from starpo.trainer.episodes import (
    KeptGroups,
    keep_uncertain_groups,
    play_step,
    rollout_metrics,
    step_seeds,
)
from starpo.trainer.mi_probe import mi_probe
from starpo.trainer.optim import Optimizers, build_optimizers
from starpo.trainer.prepare import old_logprobs_recomputed, prepare
from starpo.trainer.sinks import RunLogger, format_step_line, training_line_keys
from starpo.trainer.train_models import TrainModels, build_models
from starpo.trainer.update import UPDATE_FLOPS, SkipCounter, ppo_update, update_speed
from starpo.trainer.update_settings import UpdateSettings
from starpo.trainer.workers import Workers
from starpo.types import Trajectory

log = console_logger("starpo.trainer")


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
        if device.type == "cpu":  # before the model loads: the check samples the others
            shared = check_cpu_sharing(torch.get_num_threads())
            if shared:
                warn(shared)
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
        backend = GENERATION_BACKENDS[cfg.rollout.backend](
            self.models.actor, tokenizer, compute_dtype=decode_dtype
        )
        numerics = backend.numerics
        setting = cfg.algorithm.recompute_old_logprobs
        self.recompute_old_logprobs = old_logprobs_recomputed(setting, numerics.exact_logprobs)
        source = "recomputed in training" if self.recompute_old_logprobs else "the rollout's"
        threads = torch.get_num_threads()
        self.say(f"rollouts: {numerics.describe(threads)}; old log-probs: {source}")
        settings = (cfg.rollout.settings(), self.val_settings)
        self.workers = Workers(cfg, self.models, backend, decode_dtype, settings, self.say)
        self.saver = CheckpointSaver(cfg.trainer.checkpoint_async, self.say)
        self.start_step = 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.memory = ResponseMemory()
        self.recent_step_seconds: deque[float] = deque(maxlen=5)  # the progress line's estimate
        self.guard = CollapseGuard(cfg.diagnostics, self.run_dir, self.say, resume=resume)
        self.curriculum = None
        if cfg.curriculum.enabled:  # where episodes start: before resume restores its state
            budget = cfg.rollout.max_actions_per_traj
            self.curriculum = Curriculum(cfg.curriculum, cfg.env.id, cfg.env.kwargs, budget)
        stop_at, success_key = cfg.trainer.stop_at_success, f"val/{cfg.env.validation_id}/success"
        self.budget = TrainingBudget(cfg.trainer.max_minutes, 0.0, stop_at, success_key)
        if resume:
            self._resume()
        save_config(cfg, self.folder.config)
        self.logger = RunLogger.for_run(self.run_dir, cfg.trainer, config_to_dict(cfg), resume)
        if resume:
            self.logger.truncate_after(self.start_step)

    @property
    def val_settings(self):
        return self.cfg.rollout.settings(temperature=self.cfg.trainer.val_temperature)

    @property
    def update_settings(self) -> UpdateSettings:
        """What prepare, the update and the MI probe read of the config (read afresh: a
        rollback may change the config's sections)."""
        return UpdateSettings.of(self.cfg)

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
        """Run the remaining steps (up to `until_step`, default all; fewer once the budget
        is spent: `trainer.max_minutes`, `trainer.stop_at_success`); returns the metrics of
        every step logged in this call. The final model is exported after the last step."""
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
                metrics, last_step = self._step(step)
                skips = self.skips
                verdict = self.guard.diagnose(step, metrics, skips.limit, skips.consecutive)
                history.append(self._log(step, metrics))
                if self._due(step, self.cfg.trainer.save_every, last_step) or step == last:
                    self.save(step, healthy=verdict.state == "healthy")
                if verdict.state == "collapse" and self.on_collapse(step):
                    break
                if last_step:
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
        apply_changes(self.cfg, self.guard.rolled_back(step, state["step"], self.cfg.filter))
        return True

    # The backend and engines of the moment (Ray's while workers run), and the workers.
    @property
    def backend(self) -> Any:
        return self.workers.backend

    @property
    def pool(self) -> Any:
        return self.workers.pool

    @property
    def learners(self) -> Any:
        return self.workers.learners

    def start_workers(self) -> None:
        self.workers.start(self.optimizers, self.policy_version)

    def stop_workers(self) -> None:
        self.workers.stop(self.policy_version)

    def _due(self, step: int, every: int, last_step: bool = False) -> bool:
        """Whether a validation or save every `every` steps falls on `step`, or it is the last."""
        final = last_step or step == self.cfg.trainer.total_steps
        return final or (every > 0 and step % every == 0)

    def _step(self, step: int) -> tuple[dict[str, float], bool]:
        """One step and its validation when due, timed (timing_s/step includes the
        validation); and whether it spent the budget (trainer.max_minutes, or a validation
        reached trainer.stop_at_success), which makes it the last step."""
        timer = Timer()
        with timer("step"):
            metrics = self.train_step(step)
        metrics.update(self.saver.take_cost())  # the previous save's cost, once
        last_step = self.budget.charge(step_train_seconds({**metrics, **timer.metrics()}))
        every = self.cfg.trainer.val_every
        if every and self._due(step, every, last_step):
            with timer("step"):
                metrics.update(self.validate(step))
            last_step = self.budget.validated(step, metrics)
        metrics.update(timer.metrics())
        metrics[TRAIN_MINUTES] = self.budget.used_minutes
        return metrics, last_step

    def train_step(self, step: int) -> dict[str, float]:
        """One StarPO iteration: rollout -> filter -> advantages -> update; its metrics."""
        timer = Timer()
        with timer("rollout"):
            trajectories, metrics = self.rollout(step)
            release_free_memory()  # the KV cache's pages, before the update's activations
        settings, seed = self.update_settings, self._seed(step, 4)
        diagnostics = self.cfg.diagnostics
        metrics.update(mi_probe(step, trajectories, self.models, diagnostics, settings, seed))
        kept = self.filter(trajectories, metrics)
        self.logger.log_trajectories(step, trajectories, self.cfg.trainer.log_trajectories)
        if not kept.trajectories:  # filter.keep_zero_std=false and no group's rewards varied
            return {**metrics, **timer.metrics()}  # rollout/kept_groups = 0: no update
        with timer("update"):
            batch = self.batch(kept.trajectories)
            recompute, weights = self.recompute_old_logprobs, kept.advantage_weights
            metrics.update(prepare(batch, self.models, self.update_settings, recompute, weights))
            metrics.update(self.update(step, batch))
        seconds = max(timer.seconds["update"], 1e-9)
        metrics["perf/tokens_per_s"] = int(batch.attention_mask.sum()) / seconds
        metrics.update(update_speed(metrics.get(UPDATE_FLOPS, 0.0), seconds, self.models))
        return {**metrics, **timer.metrics()}

    def rollout(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Play this step's env groups (fresh seeds; with the curriculum, from the starts it
        planned, after which its controller moves) with the current policy."""
        self.backend.seed(self._seed(step, 1))
        starts = None
        if self.curriculum is not None:
            plan_rng = np.random.default_rng(self._seed(step, 5))
            starts = self.curriculum.plan(step_seeds(self.cfg, step), plan_rng)
        trajectories, metrics = play_step(self.workers.train_engine, self.cfg, step, starts)
        if self.curriculum is not None:
            pass_rate = metrics["signal/pass_rate"]
            metrics.update(self.curriculum.observe(starts, trajectories, pass_rate))
        metrics.update(echo_trap_metrics(trajectories, self.memory))
        self.memory.add(trajectories)
        if self.pool is not None:
            metrics.update(self.pool.metrics())
        return trajectories, metrics

    def filter(self, trajectories: list[Trajectory], metrics: dict[str, float]) -> KeptGroups:
        """StarPO-S: keep the groups whose rewards vary most (all groups when off), with
        their advantage weights (filter.soft_reweight, filter.loss_scale)."""
        kept = keep_uncertain_groups(trajectories, self.cfg.filter)
        metrics.update(kept.metrics)
        return kept

    def batch(self, trajectories: list[Trajectory]) -> TrainBatch:
        """Padded training tensors of the kept trajectories, on the actor's device."""
        pad = self.models.tokenizer.pad_token_id
        per_turn = self.cfg.algorithm.reward_placement == "per_turn"
        batch = build_batch(trajectories, pad, per_turn_rewards=per_turn)
        return batch.to(next(self.models.actor.parameters()).device)

    def update(self, step: int, batch: TrainBatch) -> dict[str, float]:
        """PPO epochs over the batch, then hand the new weights to the backend."""
        seed = self._seed(step, 2)
        generator = torch.Generator().manual_seed(seed)
        if self.workers.distributed_update:
            metrics = self.workers.update_with_learners(
                step, batch, self.optimizers, generator, seed, self.skips, self.run_dir
            )
        else:
            models, optimizers = self.models, self.optimizers
            settings = self.update_settings
            metrics = ppo_update(batch, models, optimizers, settings, generator, self.skips)
        self.backend.update_weights(self.models.actor, self.policy_version)
        metrics["actor/lr"] = self.optimizers.actor.param_groups[0]["lr"]  # the next update's
        if self.optimizers.critic is not None:
            metrics["critic/lr"] = self.optimizers.critic.param_groups[0]["lr"]
        return metrics

    def validate(self, step: int) -> dict[str, float]:
        cfg, timer = self.cfg.trainer, Timer()
        with timer("validation"):
            self.backend.seed(self._seed(0, 3))  # the same samples every time
            seeds = list(range(cfg.val_seed_start, cfg.val_seed_start + cfg.val_seeds))
            result = play_seeds(
                self.workers.val_engine,
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
        budgeted = self.budget.max_minutes is not None
        keys = training_line_keys(self.cfg.env.id, self.cfg.env.validation_id, budgeted)
        total = self.cfg.trainer.total_steps
        if "timing_s/step" in metrics:
            self.recent_step_seconds.append(metrics["timing_s/step"])
        left = time_left(self.recent_step_seconds, total - step, self.budget.seconds_left)
        self.say(format_step_line(step, total, metrics, keys, left_s=left))
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
        return checkpoint_contents(
            step,
            self.cfg,
            self.models,
            self.optimizers,
            guard=self.guard.state_dict(),
            memory=self.memory.state_dict(),
            consecutive_skips=self.skips.consecutive,
            used_minutes=self.budget.used_minutes,
            curriculum=None if self.curriculum is None else self.curriculum.state_dict(),
        )

    def save(self, step: int, healthy: bool = True) -> Path:
        """A checkpoint in `checkpoints/`; with `on_collapse=rollback`, a healthy step is also
        kept in `healthy/` (never pruned by newer, possibly collapsing, checkpoints).

        With trainer.checkpoint_async the step waits only for the previous write and for a
        snapshot of the state; the returned folder appears once the background write ends.
        """
        trainer = self.cfg.trainer
        targets = [Target(self.run_dir, trainer.keep_checkpoints, trainer.keep_every)]
        if healthy and trainer.on_collapse == "rollback":
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
        restore_training_state(self.models, self.optimizers, state, schedules)
        self.backend.update_weights(self.models.actor, self.policy_version)
        # A rollback: the other learners restart from the state the trainer has at its
        # next update (learning rates change too).
        self.workers.stop_learners()

    def _resume(self) -> None:
        state = load_checkpoint(find_resume_point(self.run_dir))
        trainer_state = state.get("trainer_state") or {}
        self.load_weights(state)
        restore_rng_state(state["rng"])
        self.skips.consecutive = int(trainer_state.get("consecutive_skips", 0))
        self.start_step = int(state["step"])
        self.budget.resume(trainer_state, self.run_dir, self.start_step)
        diagnostics = state.get("diagnostics") or {}
        if diagnostics:
            self.memory.load_state_dict(diagnostics["memory"])
        if self.curriculum is not None and trainer_state.get("curriculum") is not None:
            self.curriculum.load_state_dict(trainer_state["curriculum"])
        guard = {**diagnostics, "runtime_config": trainer_state.get("runtime_config")}
        apply_changes(self.cfg, self.guard.load_state_dict(guard, self.start_step))
        self.say(f"resumed from step {self.start_step}")

    def export_final(self) -> Path:
        """`run_dir/final/`: the trained policy as a Hugging Face folder (LoRA merged), so
        `starpo eval --policy model --model RUN/final` evaluates it."""
        models = self.models
        return export_policy(models.actor, models.tokenizer, self.folder.final, models.uses_lora)
