"""`trainer.max_minutes`: a run's budget of training minutes, kept across `--resume`.

The loop charges each step's training seconds (`starpo.timing.step_train_seconds`:
rollout, update and saving; validation excluded) and stops after the step that spends
the budget, then validates, checkpoints and exports as at `trainer.total_steps`. The
minutes used so far ride in every checkpoint (`trainer_state.train_minutes`) and on every
metrics line (`perf/train_minutes`), so a run split by `--resume` gets the budget of an
unbroken one. Pure arithmetic: no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from starpo.run_metrics import read_metrics
from starpo.timing import train_minutes

#: The key of the minutes used so far in a checkpoint's `trainer_state`.
STATE_KEY = "train_minutes"


class TrainingBudget:
    """Training minutes used against `max_minutes` (None: no budget, never spent)."""

    def __init__(self, max_minutes: float | None, used_minutes: float = 0.0) -> None:
        self.max_minutes = max_minutes
        self.used_minutes = used_minutes

    @property
    def spent(self) -> bool:
        return self.max_minutes is not None and self.used_minutes >= self.max_minutes

    def charge(self, seconds: float) -> bool:
        """Add one step's training seconds; True when that spends the budget (the run
        stops after this step)."""
        self.used_minutes += seconds / 60
        return self.spent

    def stop_line(self, step: int) -> str:
        """Said when the budget stops the run after `step`."""
        return (
            f"trainer.max_minutes={self.max_minutes:g} reached at step {step} "
            f"({self.used_minutes:.2f} minutes of training): the run stops there"
        )

    def spent_line(self, step: int) -> str:
        """Said when a resumed run finds its budget already spent."""
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
