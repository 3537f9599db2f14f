"""Wall-clock seconds per phase of a job, without hand-kept timestamps.

timer = Timer()
with timer("rollout"):
    ...
timer.metrics()  # {"timing_s/rollout": 1.23}

And the one rule for a training run's cumulative training minutes (`perf/train_minutes`),
which `trainer.max_minutes` budgets and `starpo report --x minutes` plots; and the time a
run likely still needs, for its progress line. Stdlib-only: the report imports it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

#: The cumulative training minutes logged on every step's metrics line (a timing: perf/).
TRAIN_MINUTES = "perf/train_minutes"


class Timer:
    """Adds the seconds spent inside `with timer(name):` blocks to `seconds[name]`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def metrics(self, prefix: str = "timing_s/") -> dict[str, float]:
        return {f"{prefix}{name}": value for name, value in self.seconds.items()}


def _seconds(metrics: Mapping[str, Any], key: str) -> float:
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0  # absent, or logged as null
    return float(value)


#: Timings inside `timing_s/step` that are measurements, not training.
NOT_TRAINING = ("timing_s/validation", "timing_s/mi_probe")


def step_train_seconds(metrics: Mapping[str, Any]) -> float:
    """A step's training seconds: its wall-clock (`timing_s/step`) minus its validation
    (`timing_s/validation`) and template-collapse probe (`timing_s/mi_probe`), plus the
    time the previous checkpoint save held the run up (`perf/checkpoint_s`, which rides
    on this step's line). Rollout, update and saving count; measurements do not, so how
    often they run does not change how much training a budget buys. 0 for a line without
    `timing_s/step` (step 0's validation)."""
    step = _seconds(metrics, "timing_s/step")
    if step == 0.0:
        return 0.0
    training = max(0.0, step - sum(_seconds(metrics, key) for key in NOT_TRAINING))
    return training + _seconds(metrics, "perf/checkpoint_s")


def train_minutes(records: Iterable[Mapping[str, Any]]) -> list[float]:
    """The cumulative training minutes at each metrics line, in order: `perf/train_minutes`
    where logged, else (runs from before it was logged) the running sum of
    `step_train_seconds`."""
    total, out = 0.0, []
    for record in records:
        logged = record.get(TRAIN_MINUTES)
        if isinstance(logged, int | float) and not isinstance(logged, bool):
            total = float(logged)
        else:
            total += step_train_seconds(record) / 60
        out.append(total)
    return out


def time_left(
    recent_step_seconds: Sequence[float], steps_left: int, budget_seconds_left: float | None
) -> float | None:
    """The wall-clock seconds a run likely still needs: the median of its recent steps'
    seconds (`timing_s/step`; the median, so one step that also validated or saved does not
    swing it) times the steps left, at most what `trainer.max_minutes` leaves (None: no
    budget). The budget counts training seconds only, so with validation the run takes a
    little longer than that cap. None before any step was timed."""
    if not recent_step_seconds:
        return None
    needed = statistics.median(recent_step_seconds) * max(0, steps_left)
    if budget_seconds_left is not None:
        needed = min(needed, max(0.0, budget_seconds_left))
    return needed


def format_duration(seconds: float) -> str:
    """`42 s`, `17 min` or `7.7 h`: what a progress line needs, not more."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
