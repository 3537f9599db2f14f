"""Online Echo-Trap detector: feed one step's metrics, get healthy / warning / collapse.

    detector = CollapseDetector(DetectorConfig())
    log = AlertLog(run_dir)                       # run_dir/alerts.jsonl
    verdict = detector.update(step, metrics)      # metrics: the trainer's flat dict
    metrics.update(state_metrics(verdict))
    log.write(verdict)

Each step the detector updates EMAs, running peaks, short trends and the grad-norm
z-score (see `Signals`), then asks every rule in `rules.RULES` (documented there, defaults
in `DetectorConfig`). No rule fires during the first `min_steps` updates. The state is
the worst severity among alerts raised in the last `window` steps, so a collapse stays
reported while its cause persists and fades `window` steps after it stops.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from starpo.diagnostics.config import DetectorConfig
from starpo.diagnostics.rules import (
    RULES,
    SEVERITY_LEVEL,
    Alert,
    Signals,
    trend_delta,
    window_mean_std,
)

__all__ = [
    "Alert",
    "AlertLog",
    "CollapseDetector",
    "DetectorConfig",
    "DetectorVerdict",
    "state_metrics",
]

STATES = ("healthy", "warning", "collapse")
REWARD_KEY = re.compile(r"^train/.+/reward$")


@dataclass
class DetectorVerdict:
    """The detector's answer for one step: its state and the alerts raised at this step."""

    step: int
    state: str  # "healthy" | "warning" | "collapse"
    alerts: list[Alert] = field(default_factory=list)


def find_reward_key(metrics: dict[str, float]) -> str | None:
    """First key (sorted, for determinism) of the form `train/<env>/reward`."""
    return next((k for k in sorted(metrics) if REWARD_KEY.match(k)), None)


def _lookup(metrics: dict[str, float], keys: tuple[str, ...]) -> float | None:
    """The first finite value among `keys`; None when none is present (or all nan/inf)."""
    for key in keys:
        value = metrics.get(key)
        if value is not None and math.isfinite(float(value)):
            return float(value)
    return None


def _append_bounded(values: list, item: Any, size: int) -> None:
    values.append(item)
    del values[:-size]


def observe_ema(s: Signals, name: str, x: float, cfg: DetectorConfig) -> None:
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


def observe_grad(s: Signals, step: int, x: float, cfg: DetectorConfig) -> None:
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
NARROWING_RULES = frozenset({"reward_std", "entropy", "think", "diversity"})


class CollapseDetector:
    """Online collapse detector; `update` once per training step, in step order."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self.signals = Signals(reward_key=self.config.reward_key)

    def _read(self, metrics: dict[str, float]) -> dict[str, float]:
        """The signals present in this step's metrics, by signal name."""
        cfg, s = self.config, self.signals
        if s.reward_key is None:
            s.reward_key = find_reward_key(metrics)
        success_keys = (
            cfg.success_keys
            or tuple(
                k for k in sorted(metrics) if k.startswith("train/") and k.endswith("/success")
            )[:1]
        )
        keys = {
            "success": success_keys,
            "reward": (s.reward_key,) if s.reward_key else (),
            "std": cfg.std_keys,
            "zero_std": cfg.zero_std_keys,
            "entropy": cfg.entropy_keys,
            "grad": cfg.grad_keys,
            "think": cfg.think_keys,
            "distinct": cfg.distinct_keys,
            "identical": cfg.identical_keys,
        }
        found = {name: _lookup(metrics, k) for name, k in keys.items()}
        return {name: v for name, v in found.items() if v is not None}

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
        self.signals = Signals(**copy.deepcopy(state["signals"]))


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
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        self.path = path if path.suffix == ".jsonl" else path / "alerts.jsonl"

    def write(self, verdict: DetectorVerdict) -> None:
        """Append the verdict's alerts (nothing for a step without alerts)."""
        if not verdict.alerts:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            for alert in verdict.alerts:
                record = {"step": alert.step, "state": verdict.state, **alert.to_dict()}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

    def read(self) -> list[dict[str, Any]]:
        """All logged alerts, oldest first ([] when the file does not exist)."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop alerts of steps > `step` (resuming from a checkpoint taken at `step`).

        Rewrites via a temp file and an atomic rename, so a crash leaves either log whole.
        """
        if not self.path.exists():
            return
        kept = [r for r in self.read() if r["step"] <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), "utf-8")
        os.replace(tmp, self.path)
