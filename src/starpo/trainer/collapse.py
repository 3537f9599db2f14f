"""Collapse handling during training: feed the Echo-Trap detector every step, log its
alerts, and decide what a collapse calls for as `trainer.on_collapse` says (warn, stop,
or roll back to the last healthy checkpoint with halved learning rates and filtering on).
The guard decides and keeps the record; the training loop carries the decision out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from starpo.config import FilterConfig
from starpo.diagnostics import (
    Alert,
    AlertLog,
    CollapseDetector,
    DetectorVerdict,
    DiagnosticsConfig,
    state_metrics,
)
from starpo.runs import RunFolder
from starpo.trainer.checkpoints.store import latest_checkpoint


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


def rollback_changes(filtering: FilterConfig) -> dict[str, dict[str, Any]]:
    """The config a run continues with after a rollback: uncertainty filtering on (at
    its ratio when it was on already, else keeping half of the groups)."""
    ratio = filtering.ratio if filtering.enabled else 0.5
    return {"filter": {"enabled": True, "ratio": ratio}}


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

    def diagnose(
        self, step: int, metrics: dict[str, float], skip_limit: int, skipped_in_a_row: int
    ) -> DetectorVerdict:
        """Feed the detector; log its state and alerts (metrics, alerts.jsonl, console).
        `skip_limit`, `skipped_in_a_row`: the run's non-finite update counter."""
        verdict = self.detector.update(step, metrics)
        skipped = int(metrics.get("actor/skipped_steps", 0))
        if skipped:
            verdict.alerts.append(
                skipped_updates_alert(step, skipped, skip_limit, skipped_in_a_row)
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

    def respond(self, step: int, on_collapse: str) -> str:
        """What to do about a collapse at `step` as trainer.on_collapse says: "continue"
        (warn), "stop", or "rollback". The loop carries it out (`Trainer.on_collapse`)."""
        if on_collapse == "warn":
            return "continue"
        if on_collapse == "stop":
            self.say(f"collapse detected at step {step}: stopping (trainer.on_collapse=stop)")
            return "stop"
        return "rollback"

    def rollback_point(self, step: int) -> Path | None:
        """The last healthy checkpoint to roll back to; None (said) when there is none."""
        healthy = latest_checkpoint(self.folder.healthy)
        if healthy is None:
            self.say(f"collapse at step {step} and no healthy checkpoint yet: stopping")
        return healthy

    def rolled_back(
        self, step: int, restored_step: int, filtering: FilterConfig
    ) -> dict[str, dict[str, Any]]:
        """Record a rollback to `restored_step` and return the config changes the run
        continues with (`rollback_changes`), for the loop to apply. config.yaml keeps what
        the user asked for; checkpoints carry these changes (`runtime_config`)."""
        changes = rollback_changes(filtering)
        self.runtime_config = changes
        self.detector = CollapseDetector(self.cfg)  # judge the new course afresh
        self.rollbacks += 1
        self.say(
            f"collapse at step {step}: rolled back to step {restored_step}, halved the "
            f"learning rates, filter on (ratio {changes['filter']['ratio']})"
        )
        return changes

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "detector": self.detector.state_dict(),
            "rollbacks": self.rollbacks,
            "runtime_config": self.runtime_config,
        }

    def load_state_dict(self, state: dict[str, Any], step: int) -> dict[str, dict[str, Any]]:
        """Restore the detector; drop alerts of steps after the checkpoint's `step`; return
        the config changes a rollback made before it (for the loop to apply again)."""
        if "detector" in state:
            self.detector.load_state_dict(state["detector"])
        self.rollbacks = int(state.get("rollbacks", 0))
        self.runtime_config = state.get("runtime_config") or {}
        for section, values in self.runtime_config.items():
            self.say(f"resumed with {section} {values} (set by a rollback)")
        self.alerts.truncate_after(step)
        return self.runtime_config
