"""The StarPO loop. One iteration, top to bottom: rollout, filter, advantages, update, log,
validate, checkpoint."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

from starpo.algorithms import filter_groups
from starpo.config import TrainConfig, config_to_dict, save_config
from starpo.diagnostics import (
    Alert,
    AlertLog,
    CollapseDetector,
    DetectorConfig,
    DetectorVerdict,
    ResponseMemory,
    echo_trap_metrics,
    state_metrics,
)
from starpo.envs import make
from starpo.rollout.engine import RolloutEngine, RolloutSettings
from starpo.rollout.evaluate import ModelEvalResult, play_seeds, summarise_trajectories
from starpo.rollout.hf_backend import HFBackend
from starpo.trainer.batch import build_batch
from starpo.trainer.checkpoint import (
    capture_rng_state,
    find_resume_point,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from starpo.trainer.models import (
    TrainModels,
    build_models,
    load_trainable_state,
    trainable_state,
)
from starpo.trainer.optim import Optimizers, build_optimizers
from starpo.trainer.precision import precision_for
from starpo.trainer.sinks import RunLogger, format_step_line
from starpo.trainer.update import SkipCounter, ppo_update, prepare
from starpo.types import Trajectory


def rollout_metrics(prefix: str, result: ModelEvalResult) -> dict[str, float]:
    """Namespaced episode statistics: `train/<env>/success`, `val/<env>/success`, ..."""
    summary = summarise_trajectories(result)
    low, high = summary.pop("success_rate_ci95")
    renamed = {
        "success_rate": "success",
        "mean_reward": "reward",
        "mean_train_reward": "train_reward",
        "format_ok_rate": "format_ok",
        "mean_actions": "num_actions",
        "mean_turns": "num_turns",
    }
    speed = summary.pop("generation_tokens_per_s")
    out = {f"{prefix}/{renamed.get(k, k)}": float(v) for k, v in summary.items()}
    # A timing, so under perf/ (runs compare exactly on everything but timings).
    out[f"perf/{prefix.split('/')[0]}_generated_tokens_per_s"] = speed
    out[f"{prefix}/success_ci95_low"], out[f"{prefix}/success_ci95_high"] = low, high
    return out


def group_rewards(trajectories: list[Trajectory]) -> list[list[float]]:
    """Training rewards per env group, in group order."""
    groups: dict[int, list[float]] = {}
    for t in trajectories:
        groups.setdefault(t.group, []).append(t.reward)
    return [groups[g] for g in sorted(groups)]


def skipped_updates_alert(step: int, skipped: int, skips: SkipCounter) -> Alert:
    """The alert of a step whose updates were skipped for NaN/Inf (see `ppo_update`)."""
    return Alert(
        step=step,
        rule="non_finite_update",
        severity="warning",
        message=(
            f"{skipped} update(s) skipped: non-finite loss or gradient norm; the run stops "
            f"after {skips.limit} in a row (now {skips.consecutive})"
        ),
        value=float(skipped),
        threshold=0.0,
    )


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
        from starpo.models.loading import resolve_device, resolve_dtype

        self.cfg, self.run_dir, self.quiet = cfg, Path(run_dir), quiet
        make(cfg.env.id, **cfg.env.kwargs)  # bad env ids / kwargs fail before the model loads
        make(cfg.env.validation_id, **cfg.env.validation_kwargs)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.trainer.seed)
        device = resolve_device(cfg.model.device)
        self.precision = precision_for(resolve_dtype(cfg.model.dtype, device), device)
        if model is None:
            # Loaded in fp32: the master weights; build_models stores frozen ones in bf16.
            model, tokenizer = load_model(cfg.model.name, device=cfg.model.device, dtype="fp32")
        self.models: TrainModels = build_models(cfg, model, tokenizer, self.precision)
        self.optimizers: Optimizers = build_optimizers(cfg, self.models.actor, self.models.critic)
        self.skips = SkipCounter(cfg.optim.max_skipped_updates)
        self.backend = HFBackend(
            self.models.actor,
            pad_token_id=tokenizer.pad_token_id,
            compute_dtype=self.precision.compute_dtype,
        )
        recompute = cfg.algorithm.recompute_old_logprobs
        # auto: the rollout's log-probs are exact only when it computes as the update does.
        self.recompute_old_logprobs = self.precision.mixed if recompute is None else recompute
        base = cfg.rollout.settings_kwargs()
        self.train_engine = RolloutEngine(self.backend, tokenizer, RolloutSettings(**base))
        val = cfg.rollout.settings_kwargs(temperature=cfg.trainer.val_temperature)
        self.val_engine = RolloutEngine(self.backend, tokenizer, RolloutSettings(**val))
        self.start_step = 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.detector = CollapseDetector(DetectorConfig())
        self.memory = ResponseMemory()
        self.alerts = AlertLog(self.run_dir / "alerts.jsonl")
        self.rollbacks = 0
        self.runtime_config: dict[str, dict[str, Any]] = {}  # config changed while running
        self._alerting: set[str] = set()
        if not resume:
            self.alerts.path.unlink(missing_ok=True)  # a new run starts a new alert log
        if resume:
            self._resume()
            self.alerts.truncate_after(self.start_step)
        save_config(cfg, self.run_dir / "config.yaml")
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

    # ------------------------------------------------------------------------ setup
    def _step_generator(self, step: int, purpose: int) -> int:
        """A seed per (run seed, step, purpose): resumed runs sample exactly the same."""
        return (self.cfg.trainer.seed * 1_000_003 + step) * 10 + purpose

    # ------------------------------------------------------------------------- loop
    def train(self, until_step: int | None = None) -> list[dict[str, Any]]:
        """Run the remaining steps (up to `until_step`, default all); returns the metrics of
        every step logged in this call. The final model is exported after the last step."""
        total, history = self.cfg.trainer.total_steps, []
        last = total if until_step is None else min(until_step, total)
        try:
            if self.start_step == 0 and self.cfg.trainer.val_before_train:
                history.append(self._log(0, self.validate(0)))
            for step in range(self.start_step + 1, last + 1):
                started = time.perf_counter()
                metrics = self.train_step(step)
                if self._due(step, self.cfg.trainer.val_every):
                    metrics.update(self.validate(step))
                metrics["timing_s/step"] = time.perf_counter() - started
                verdict = self.diagnose(step, metrics)
                history.append(self._log(step, metrics))
                if self._due(step, self.cfg.trainer.save_every) or step == last:
                    self.save(step, healthy=verdict.state == "healthy")
                if verdict.state == "collapse" and self._on_collapse(step):
                    break
            if last == total:
                self.export_final()
        finally:
            self.logger.close()
        return history

    def _due(self, step: int, every: int) -> bool:
        return step == self.cfg.trainer.total_steps or (every > 0 and step % every == 0)

    def train_step(self, step: int) -> dict[str, float]:
        cfg, timings = self.cfg, {}
        started = time.perf_counter()
        first_seed = cfg.rollout.train_seed_start + (step - 1) * cfg.rollout.num_groups
        seeds = list(range(first_seed, first_seed + cfg.rollout.num_groups))
        self.backend.generator.manual_seed(self._step_generator(step, 1))
        gen_before = self.train_engine.generation_seconds
        trajectories = self.train_engine.run(
            cfg.env.id, seeds, cfg.rollout.group_size, env_kwargs=cfg.env.kwargs
        )
        result = ModelEvalResult(trajectories, self.train_engine.generation_seconds - gen_before)
        metrics = rollout_metrics(f"train/{cfg.env.id}", result)
        metrics.update(echo_trap_metrics(trajectories, self.memory))
        self.memory.add(trajectories)
        timings["timing_s/rollout"] = time.perf_counter() - started
        kept = self.filter(trajectories, metrics)
        started = time.perf_counter()
        batch = build_batch(
            kept,
            self.models.tokenizer.pad_token_id,
            per_turn_rewards=cfg.algorithm.reward_placement == "per_turn",
        )
        batch = batch.to(next(self.models.actor.parameters()).device)
        metrics.update(prepare(batch, self.models, cfg, self.recompute_old_logprobs))
        generator = torch.Generator().manual_seed(self._step_generator(step, 2))
        metrics.update(ppo_update(batch, self.models, self.optimizers, cfg, generator, self.skips))
        timings["timing_s/update"] = time.perf_counter() - started
        tokens = int(batch.attention_mask.sum())
        metrics["perf/tokens_per_s"] = tokens / max(timings["timing_s/update"], 1e-9)
        metrics["response_length/mean"] = metrics[f"train/{cfg.env.id}/mean_response_tokens"]
        metrics["response_length/think_mean"] = metrics[f"train/{cfg.env.id}/mean_think_tokens"]
        metrics["actor/lr"] = self.optimizers.actor.param_groups[0]["lr"]  # for the next update
        if self.optimizers.critic is not None:
            metrics["critic/lr"] = self.optimizers.critic.param_groups[0]["lr"]
        self.logger.log_trajectories(step, trajectories, cfg.trainer.log_trajectories)
        return {**metrics, **timings}

    def filter(self, trajectories: list[Trajectory], metrics: dict[str, float]) -> list[Trajectory]:
        """StarPO-S: keep the groups whose rewards vary most (all groups when off)."""
        cfg = self.cfg.filter
        ratio = cfg.ratio if cfg.enabled else 1.0
        result = filter_groups(group_rewards(trajectories), ratio, cfg.mode)
        metrics["rollout/in_group_std"] = result.std_all
        metrics["rollout/kept_in_group_std"] = result.std_kept
        metrics["rollout/zero_std_groups"] = sum(s == 0 for s in result.group_std) / len(
            result.group_std
        )
        kept = set(result.kept)
        chosen = [t for t in trajectories if t.group in kept]
        metrics["rollout/kept_trajectories"] = len(chosen)
        return chosen

    def validate(self, step: int) -> dict[str, float]:
        cfg = self.cfg.trainer
        started = time.perf_counter()
        self.backend.generator.manual_seed(self._step_generator(0, 3))  # same every time
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
        metrics["timing_s/validation"] = time.perf_counter() - started
        return metrics

    def _log(self, step: int, metrics: dict[str, float]) -> dict[str, Any]:
        self.logger.log(step, metrics)
        if not self.quiet:
            train, val = f"train/{self.cfg.env.id}", f"val/{self.cfg.env.validation_id}"
            keys = {
                "success": f"{train}/success",
                "reward": f"{train}/reward",
                "format_ok": f"{train}/format_ok",
                "entropy": "actor/entropy",
                "grad_norm": "actor/grad_norm",
                "val_success": f"{val}/success",
            }
            line = format_step_line(step, self.cfg.trainer.total_steps, metrics, keys)
            print(line, file=sys.stderr, flush=True)
        return {"step": step, **metrics}

    # ----------------------------------------------------------------- diagnostics
    def diagnose(self, step: int, metrics: dict[str, float]) -> DetectorVerdict:
        """Feed the collapse detector; log its state and alerts (metrics, alerts.jsonl, console)."""
        verdict = self.detector.update(step, metrics)
        skipped = int(metrics.get("actor/skipped_steps", 0))
        if skipped:
            verdict.alerts.append(skipped_updates_alert(step, skipped, self.skips))
            verdict.state = "collapse" if verdict.state == "collapse" else "warning"
        metrics.update(state_metrics(verdict))
        metrics["diagnostics/rollbacks"] = float(self.rollbacks)
        self.alerts.write(verdict)
        new = [a for a in verdict.alerts if a.rule not in self._alerting]
        self._alerting = {a.rule for a in verdict.alerts}  # print a rule when it starts firing
        if not self.quiet:
            for alert in new:
                print(
                    f"  [{alert.severity}] step {step} {alert.rule}: {alert.message}",
                    file=sys.stderr,
                    flush=True,
                )
        return verdict

    def _on_collapse(self, step: int) -> bool:
        """Act on a collapse as `trainer.on_collapse` says; True means stop training."""
        action = self.cfg.trainer.on_collapse
        if action == "warn":
            return False
        if action == "stop":
            print(
                f"collapse detected at step {step}: stopping (trainer.on_collapse=stop)",
                file=sys.stderr,
                flush=True,
            )
            self.save(step, healthy=False)
            return True
        return not self._rollback(step)

    def _rollback(self, step: int) -> bool:
        """Restore the last healthy checkpoint and continue more conservatively: half the
        learning rates, and uncertainty filtering on. False when there is nothing to restore."""
        healthy = latest_checkpoint(self.run_dir / "healthy")
        if healthy is None:
            print(
                f"collapse at step {step} and no healthy checkpoint yet: stopping",
                file=sys.stderr,
                flush=True,
            )
            return False
        state = load_checkpoint(healthy)
        # Weights and optimizer moments go back; the schedule keeps its place, at half rate.
        self._load_weights(state, schedules=False)
        self.optimizers.scale_lr(0.5)
        if not self.cfg.filter.enabled:
            self.cfg.filter.enabled, self.cfg.filter.ratio = True, 0.5
        # config.yaml keeps what the user asked for; checkpoints carry this live change.
        self.runtime_config = {"filter": {"enabled": True, "ratio": self.cfg.filter.ratio}}
        self.detector = CollapseDetector(DetectorConfig())  # judge the new course afresh
        self.rollbacks += 1
        print(
            f"collapse at step {step}: rolled back to step {state['step']}, halved the "
            f"learning rates, filter on (ratio {self.cfg.filter.ratio})",
            file=sys.stderr,
            flush=True,
        )
        return True

    # ----------------------------------------------------------------- checkpoints
    def save(self, step: int, healthy: bool = True) -> Path:
        """A checkpoint in `checkpoints/`; with `on_collapse=rollback`, a healthy step is also
        kept in `healthy/` (never pruned by newer, possibly collapsing, checkpoints)."""
        models, optimizers = self.models, self.optimizers
        state = {
            "step": step,
            "actor": trainable_state(models.actor),
            "critic": trainable_state(models.critic) if models.critic is not None else None,
            **optimizers.state_dict(),  # optimizers and learning-rate schedules
            "rng": capture_rng_state(),
            "config": config_to_dict(self.cfg),
            "diagnostics": {
                "detector": self.detector.state_dict(),
                "memory": self.memory.state_dict(),
                "rollbacks": self.rollbacks,
            },
            "trainer_state": {
                "runtime_config": self.runtime_config,  # changed by a rollback
                "consecutive_skips": self.skips.consecutive,
            },
        }
        if healthy and self.cfg.trainer.on_collapse == "rollback":
            save_checkpoint(self.run_dir / "healthy", step, state, keep=1)
        return save_checkpoint(self.run_dir, step, state, keep=self.cfg.trainer.keep_checkpoints)

    def _load_weights(self, state: dict[str, Any], schedules: bool = True) -> None:
        load_trainable_state(self.models.actor, state["actor"])
        if self.models.critic is not None:
            load_trainable_state(self.models.critic, state["critic"])
        self.optimizers.load_state_dict(state, schedules=schedules)

    def _resume(self) -> None:
        state = load_checkpoint(find_resume_point(self.run_dir))
        self._load_weights(state)
        restore_rng_state(state["rng"])
        trainer_state = state.get("trainer_state") or {}
        self.skips.consecutive = int(trainer_state.get("consecutive_skips", 0))
        self.runtime_config = trainer_state.get("runtime_config") or {}
        for section, values in self.runtime_config.items():
            for key, value in values.items():
                setattr(getattr(self.cfg, section), key, value)
            if not self.quiet:
                print(f"resumed with {section} {values} (set by a rollback)", file=sys.stderr)
        diagnostics = state.get("diagnostics")
        if diagnostics:
            self.detector.load_state_dict(diagnostics["detector"])
            self.memory.load_state_dict(diagnostics["memory"])
            self.rollbacks = diagnostics["rollbacks"]
        self.start_step = int(state["step"])
        if not self.quiet:
            print(f"resumed from step {self.start_step}", file=sys.stderr)

    def export_final(self) -> Path:
        """`run_dir/final/`: the trained policy as a Hugging Face folder (LoRA merged), so
        `starpo eval --policy model --model RUN/final` evaluates it."""
        folder = self.run_dir / "final"
        actor = self.models.actor
        if self.models.uses_lora:
            import copy

            actor = copy.deepcopy(actor).merge_and_unload()
        actor.save_pretrained(folder)
        self.models.tokenizer.save_pretrained(folder)
        return folder
