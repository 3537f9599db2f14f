"""Collapse handling during training: feed the Echo-Trap detector every step, log its
alerts, and act on a collapse as `trainer.on_collapse` says (warn, stop, or roll back to
the last healthy checkpoint with halved learning rates and filtering on)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starpo.config import TrainConfig
from starpo.diagnostics import (
    Alert,
    AlertLog,
    CollapseDetector,
    DetectorVerdict,
    DiagnosticsConfig,
    state_metrics,
)
from starpo.runs import RunFolder
from starpo.trainer.checkpoint import latest_checkpoint, load_checkpoint

if TYPE_CHECKING:
    from starpo.trainer.loop import Trainer
    from starpo.trainer.update import SkipCounter


def skipped_updates_alert(step: int, skipped: int, limit: int, consecutive: int) -> Alert:
    """The alert of a step whose updates were skipped for NaN/Inf (see `ppo_update`)."""
    return Alert(
        step=step,
        rule="non_finite_update",
        severity="warning",
        message=(
            f"{skipped} update(s) skipped: non-finite loss or gradient norm; the run stops "
            f"after {limit} in a row (now {consecutive})"
        ),
        value=float(skipped),
        threshold=0.0,
    )


class CollapseGuard:
    """The detector, its alert log and what a rollback changed (all checkpointed)."""

    def __init__(
        self, cfg: DiagnosticsConfig, run_dir: Path, say: Callable[[str], None], resume: bool
    ) -> None:
        self.cfg, self.folder, self.say = cfg, RunFolder(Path(run_dir)), say
        self.detector = CollapseDetector(cfg)
        self.alerts = AlertLog(self.folder.alerts)
        self.rollbacks = 0
        self.runtime_config: dict[str, dict[str, Any]] = {}  # config changed while running
        self._alerting: set[str] = set()
        if not resume:
            self.alerts.path.unlink(missing_ok=True)  # a new run starts a new alert log

    def diagnose(self, step: int, metrics: dict[str, float], skips: SkipCounter) -> DetectorVerdict:
        """Feed the detector; log its state and alerts (metrics, alerts.jsonl, console)."""
        verdict = self.detector.update(step, metrics)
        skipped = int(metrics.get("actor/skipped_steps", 0))
        if skipped:
            verdict.alerts.append(
                skipped_updates_alert(step, skipped, skips.limit, skips.consecutive)
            )
            verdict.state = "collapse" if verdict.state == "collapse" else "warning"
        metrics.update(state_metrics(verdict))
        metrics["diagnostics/rollbacks"] = float(self.rollbacks)
        self.alerts.write(verdict)
        new = [a for a in verdict.alerts if a.rule not in self._alerting]
        self._alerting = {a.rule for a in verdict.alerts}  # print a rule when it starts firing
        for alert in new:
            self.say(f"  [{alert.severity}] step {step} {alert.rule}: {alert.message}")
        return verdict

    def respond(self, step: int, trainer: Trainer) -> bool:
        """Act on a collapse as `trainer.on_collapse` says; True means stop training."""
        action = trainer.cfg.trainer.on_collapse
        if action == "warn":
            return False
        if action == "stop":
            self.say(f"collapse detected at step {step}: stopping (trainer.on_collapse=stop)")
            trainer.save(step, healthy=False)
            return True
        return not self._rollback(step, trainer)

    def _rollback(self, step: int, trainer: Trainer) -> bool:
        """Restore the last healthy checkpoint and continue more conservatively: half the
        learning rates, and uncertainty filtering on. False when there is nothing to restore."""
        trainer.wait_for_checkpoint()  # a healthy/ copy may still be written in the background
        healthy = latest_checkpoint(self.folder.healthy)
        if healthy is None:
            self.say(f"collapse at step {step} and no healthy checkpoint yet: stopping")
            return False
        state = load_checkpoint(healthy)
        # Weights and optimizer moments go back; the schedule keeps its place, at half rate.
        trainer.load_weights(state, schedules=False)
        trainer.optimizers.scale_lr(0.5)
        filtering = trainer.cfg.filter
        if not filtering.enabled:
            filtering.enabled, filtering.ratio = True, 0.5
        # config.yaml keeps what the user asked for; checkpoints carry this live change.
        self.runtime_config = {"filter": {"enabled": True, "ratio": filtering.ratio}}
        self.detector = CollapseDetector(self.cfg)  # judge the new course afresh
        self.rollbacks += 1
        self.say(
            f"collapse at step {step}: rolled back to step {state['step']}, halved the "
            f"learning rates, filter on (ratio {filtering.ratio})"
        )
        return True

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "detector": self.detector.state_dict(),
            "rollbacks": self.rollbacks,
            "runtime_config": self.runtime_config,
        }

    def load_state_dict(self, state: dict[str, Any], cfg: TrainConfig, step: int) -> None:
        """Restore the detector and a rollback's config changes (onto `cfg`); drop alerts
        of steps after the checkpoint's `step`."""
        if "detector" in state:
            self.detector.load_state_dict(state["detector"])
        self.rollbacks = int(state.get("rollbacks", 0))
        self.runtime_config = state.get("runtime_config") or {}
        for section, values in self.runtime_config.items():
            for key, value in values.items():
                setattr(getattr(cfg, section), key, value)
            self.say(f"resumed with {section} {values} (set by a rollback)")
        self.alerts.truncate_after(step)
