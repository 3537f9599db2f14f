"""Online Echo-Trap detector: feed one step's metrics, get healthy / warning / collapse.

    detector = CollapseDetector(DiagnosticsConfig())
    log = AlertLog(run_dir)                       # run_dir/alerts.jsonl
    verdict = detector.update(step, metrics)      # metrics: the trainer's flat dict
    metrics.update(state_metrics(verdict))
    log.write(verdict)

Each step the detector updates EMAs, running peaks, short trends and the grad-norm
z-score (see `Signals`), then asks every rule in `rules.RULES` (documented there, defaults
in `DiagnosticsConfig`). No rule fires during the first `min_steps` updates. The state is
the worst severity among alerts raised in the last `window` steps, so a collapse stays
reported while its cause persists and fades `window` steps after it stops.
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starpo import runs
from starpo.config.diagnostics import DiagnosticsConfig
from starpo.diagnostics.rules import (
    RULES,
    SEVERITY_LEVEL,
    Alert,
    Signals,
    trend_delta,
    window_mean_std,
)
from starpo.runs.metrics import load_step_records

__all__ = [
    "Alert",
    "AlertLog",
    "CollapseDetector",
    "DiagnosticsConfig",
    "DetectorVerdict",
    "state_metrics",
]

STATES = ("healthy", "warning", "collapse")


@dataclass
class DetectorVerdict:
    """The detector's answer for one step: its state and the alerts raised at this step."""

    step: int
    state: str  # "healthy" | "warning" | "collapse"
    alerts: list[Alert] = field(default_factory=list)


def find_key(metrics: dict[str, float], pattern: str) -> str | None:
    """The key of `metrics` that `pattern` names, where `*` stands for one key part (e.g.
    `train/*/reward` finds `train/bandit/reward`); the first in sorted order, for
    determinism. None when no key matches."""
    if "*" not in pattern:
        return pattern if pattern in metrics else None
    regex = re.compile("[^/]+".join(re.escape(part) for part in pattern.split("*")))
    return next((k for k in sorted(metrics) if regex.fullmatch(k)), None)


def _append_bounded(values: list, item: Any, size: int) -> None:
    values.append(item)
    del values[:-size]


def observe_ema(s: Signals, name: str, x: float, cfg: DiagnosticsConfig) -> None:
    """Fold `x` into the EMA of `name` and its peak / low / base / trend."""
    prev = s.ema.get(name)
    ema = x if prev is None else cfg.ema_alpha * x + (1.0 - cfg.ema_alpha) * prev
    s.ema[name] = ema
    s.low[name] = min(s.low.get(name, ema), ema)
    if ema > s.peak.get(name, -math.inf):
        s.peak[name] = ema
        # The rise to this peak is measured from the lowest point before it.
        s.base[name] = s.low[name]
    _append_bounded(s.trend.setdefault(name, []), ema, cfg.trend_steps + 1)


def observe_grad(s: Signals, step: int, x: float, cfg: DiagnosticsConfig) -> None:
    """Z-score `x` against the running window, record a spike, then add `x` (clipped).

    The value added is clipped at mean + grad_z * std so one spike does not inflate the
    window's std enough to hide the next one.
    """
    s.grad_z = s.grad_ratio = None
    history = s.grad_history
    if len(history) >= cfg.grad_min_history:
        mean, std = window_mean_std(history)
        std = max(std, cfg.grad_std_floor * abs(mean), 1e-12)
        s.grad_z = (x - mean) / std
        s.grad_ratio = x / mean if mean > 0 else math.inf
        if s.grad_z > cfg.grad_z and s.grad_ratio > cfg.grad_min_ratio:
            _append_bounded(s.spike_steps, step, 8)
        x = min(x, mean + cfg.grad_z * std)
    _append_bounded(history, x, cfg.grad_window)


#: Rules about the policy narrowing; quiet once the task is solved (see solved_success).
NARROWING_RULES = frozenset({"reward_std", "entropy", "think", "diversity", "template"})


class CollapseDetector:
    """Online collapse detector; `update` once per training step, in step order."""

    def __init__(self, config: DiagnosticsConfig | None = None) -> None:
        self.config = DiagnosticsConfig() if config is None else config
        self.signals = Signals()

    def _read(self, metrics: dict[str, float]) -> dict[str, float]:
        """The finite signals present in this step's metrics, by signal name. A key with a
        `*` is resolved the first time it matches and then kept (`Signals.keys`)."""
        keys, found = self.signals.keys, {}
        for name, pattern in self.config.signal_keys().items():
            if name not in keys and (key := find_key(metrics, pattern)) is not None:
                keys[name] = key
            value = metrics.get(keys[name]) if name in keys else None
            if value is not None and math.isfinite(float(value)):
                found[name] = float(value)
        return found

    def update(self, step: int, metrics: dict[str, float]) -> DetectorVerdict:
        """Fold in one step's metrics and return the verdict for this step."""
        cfg, s = self.config, self.signals
        values = self._read(metrics)
        s.grad_z = s.grad_ratio = None
        if "grad" in values:
            observe_grad(s, step, values.pop("grad"), cfg)
        if "reward" in values:
            _append_bounded(s.reward_raw, values["reward"], cfg.noise_window)
        for name, x in values.items():
            observe_ema(s, name, x, cfg)
        s.updates += 1
        alerts: list[Alert] = []
        if s.updates > cfg.min_steps:
            rules = [
                r
                for name, r in RULES.items()
                if not (name in NARROWING_RULES and self.converging())
            ]
            alerts = [a for rule in rules if (a := rule(s, cfg, step)) is not None]
        return DetectorVerdict(step, self._record(step, alerts), alerts)

    def converging(self) -> bool:
        """Narrowing is expected while the success rate climbs or once the task is solved:
        success EMA >= solved_success, or up by more than learning_rise over trend_steps."""
        s, cfg = self.signals, self.config
        rise = trend_delta(s, "success")
        solved = s.ema.get("success", 0.0) >= cfg.solved_success
        return solved or (rise is not None and rise > cfg.learning_rise)

    def _record(self, step: int, alerts: list[Alert]) -> str:
        """Remember this step's alerts and return the worst state over the window."""
        s, window = self.signals, self.config.window
        if alerts and s.first_warning_step is None:
            s.first_warning_step = step
        s.recent = [r for r in s.recent if step - r[0] < window]
        s.recent += [[step, a.rule, a.severity] for a in alerts]
        return self.state

    @property
    def state(self) -> str:
        """Worst severity among the alerts remembered for the window ("healthy" if none)."""
        level = max((SEVERITY_LEVEL[r[2]] for r in self.signals.recent), default=0)
        return STATES[level]

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; `load_state_dict` resumes exactly from it."""
        return {"version": 1, "signals": copy.deepcopy(asdict(self.signals))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (the config stays this detector's own)."""
        if state.get("version") != 1:
            raise ValueError(f"unknown detector state version {state.get('version')!r}")
        signals = copy.deepcopy(state["signals"])
        reward_key = signals.pop("reward_key", None)  # checkpoints from before `keys`
        if reward_key is not None:
            signals.setdefault("keys", {}).setdefault("reward", reward_key)
        self.signals = Signals(**signals)


def state_metrics(verdict: DetectorVerdict) -> dict[str, float]:
    """Flat floats for the sinks: `diagnostics/state` (0 healthy, 1 warning, 2 collapse)
    and `diagnostics/alert/<rule>` (1.0 when that rule raised an alert at this step)."""
    fired = {a.rule for a in verdict.alerts}
    out = {"diagnostics/state": float(SEVERITY_LEVEL[verdict.state])}
    out.update({f"diagnostics/alert/{rule}": float(rule in fired) for rule in RULES})
    return out


class AlertLog:
    """Appends alerts to `alerts.jsonl`: one JSON object per alert and step.

    `path` is the file itself when it ends in `.jsonl`, else a folder holding
    `alerts.jsonl`. Fields: step, state, rule, severity, message, value, threshold.
    Reading and rewriting follow `starpo.runs` (a half-written last line is skipped).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        self.path = path if path.suffix == ".jsonl" else path / runs.ALERTS_FILE

    def write(self, verdict: DetectorVerdict) -> None:
        """Append the verdict's alerts (nothing for a step without alerts)."""
        if not verdict.alerts:
            return
        runs.append_jsonl(
            self.path,
            ({"step": a.step, "state": verdict.state, **a.to_dict()} for a in verdict.alerts),
        )

    def read(self) -> list[dict[str, Any]]:
        """All logged alerts, oldest first ([] when the file does not exist), read as
        `run_metrics.read_alerts` reads them (a line without an integer 'step' is broken)."""
        return load_step_records(self.path).records

    def truncate_after(self, step: int) -> None:
        """Drop alerts of steps > `step` (resuming from a checkpoint taken at `step`);
        atomic, so a crash leaves either log whole."""
        runs.truncate_jsonl(self.path, step)
