"""When a run stops before `trainer.total_steps`: `trainer.max_minutes`, a budget of
training minutes kept across `--resume`, and `trainer.stop_at_success`, a validation
success that ends training early.

The loop charges each step's training seconds (`starpo.timing.step_train_seconds`:
rollout, update and saving; validation excluded) and stops after the step that spends
the budget, then validates, checkpoints and exports as at `trainer.total_steps`. The
minutes used so far ride in every checkpoint (`trainer_state.train_minutes`) and on every
metrics line (`perf/train_minutes`), so a run split by `--resume` gets the budget of an
unbroken one. A validation whose success reaches `stop_at_success` makes its step the
last in the same way; a resumed run finds it again in its metrics lines. Pure
arithmetic: no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from starpo.runs.metrics import read_metrics
from starpo.timing import train_minutes

#: The key of the minutes used so far in a checkpoint's `trainer_state`.
STATE_KEY = "train_minutes"


class TrainingBudget:
    """Training minutes used against `max_minutes` (None: no budget), and the validation
    success `stop_at_success` read at `success_key` (None: train on); spent when either
    is reached."""

    def __init__(
        self,
        max_minutes: float | None,
        used_minutes: float = 0.0,
        stop_at_success: float | None = None,
        success_key: str = "",
    ) -> None:
        self.max_minutes = max_minutes
        self.used_minutes = used_minutes
        self.stop_at_success = stop_at_success
        self.success_key = success_key
        self.reached: tuple[int, float] | None = None  # (step, success) that reached it

    @property
    def out_of_time(self) -> bool:
        return self.max_minutes is not None and self.used_minutes >= self.max_minutes

    @property
    def seconds_left(self) -> float | None:
        """Training seconds `max_minutes` leaves (None: no budget)."""
        if self.max_minutes is None:
            return None
        return max(0.0, self.max_minutes - self.used_minutes) * 60

    @property
    def spent(self) -> bool:
        return self.out_of_time or self.reached is not None

    def charge(self, seconds: float) -> bool:
        """Add one step's training seconds; True when that spends the budget (the run
        stops after this step)."""
        self.used_minutes += seconds / 60
        return self.spent

    def validated(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Read a step's validation success; True when the budget is spent (the run stops
        after this step)."""
        success = metrics.get(self.success_key)
        target = self.stop_at_success
        if self.reached is None and target is not None and success is not None:
            if success >= target and step > 0:  # step 0: the start, before any training
                self.reached = (step, float(success))
        return self.spent

    def resume(self, trainer_state: Mapping[str, Any], run_dir: Path, step: int) -> None:
        """Take up a run resumed from its checkpoint of `step`: the minutes it had used,
        and a validation up to that step that reached `stop_at_success`."""
        self.used_minutes = resumed_minutes(trainer_state, run_dir, step)
        if self.stop_at_success is None:
            return  # no target to find: the metrics lines need not be read
        for row in read_metrics(run_dir):
            if row["step"] <= step:
                self.validated(int(row["step"]), row)

    def stop_line(self, step: int) -> str:
        """Said when the budget stops the run after `step`."""
        if self.reached is not None:
            return (
                f"trainer.stop_at_success={self.stop_at_success:g} reached at step {step} "
                f"(validation success {self.reached[1]:.1%}): the run stops there"
            )
        return (
            f"trainer.max_minutes={self.max_minutes:g} reached at step {step} "
            f"({self.used_minutes:.2f} minutes of training): the run stops there"
        )

    def spent_line(self, step: int) -> str:
        """Said when a resumed run finds its budget already spent."""
        if self.reached is not None:
            return (
                f"trainer.stop_at_success={self.stop_at_success:g} was reached at step "
                f"{self.reached[0]} (validation success {self.reached[1]:.1%}): nothing left "
                "to train; to go on, raise trainer.stop_at_success (or set it to null) and "
                "--resume"
            )
        return (
            f"trainer.max_minutes={self.max_minutes:g} was spent by step {step} "
            f"({self.used_minutes:.2f} minutes of training): nothing left to train; to go "
            "on, raise trainer.max_minutes (or set it to null) and --resume"
        )


def resumed_minutes(trainer_state: Mapping[str, Any], run_dir: Path, step: int) -> float:
    """The training minutes a run had used by its checkpoint of `step`: as the checkpoint
    carries them, else (a checkpoint from before budgets) re-derived from `run_dir`'s
    metrics lines up to that step."""
    if trainer_state.get(STATE_KEY) is not None:
        return float(trainer_state[STATE_KEY])
    minutes = train_minutes(r for r in read_metrics(run_dir) if r["step"] <= step)
    return minutes[-1] if minutes else 0.0
