"""trainer.max_minutes: the budget's arithmetic, the training-minutes rule (validation out,
saving in) under a fake clock, and how a resumed run finds the minutes it had used."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from starpo import timing
from starpo.timing import TRAIN_MINUTES, Timer, step_train_seconds, train_minutes
from starpo.trainer.budget import STATE_KEY, TrainingBudget, resumed_minutes


class FakeClock:
    """`time.perf_counter` that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def play_step(
    clock: FakeClock, budget: TrainingBudget, train_s: float, val_s: float = 0.0, save_s=None
) -> tuple[dict[str, float], bool]:
    """A step timed as `Trainer._step` times it: training in one `step` block, then the
    budget's verdict, then validation (when any) in a second `step` block."""
    timer = Timer()
    with timer("step"):
        clock.advance(train_s)
    metrics = {} if save_s is None else {"perf/checkpoint_s": save_s}
    out_of_time = budget.charge(step_train_seconds({**metrics, **timer.metrics()}))
    if val_s:
        with timer("step"), timer("validation"):
            clock.advance(val_s)
    metrics.update(timer.metrics())
    metrics[TRAIN_MINUTES] = budget.used_minutes
    return metrics, out_of_time


def test_no_budget_is_never_spent():
    budget = TrainingBudget(None)
    assert not budget.charge(10**9) and not budget.spent
    assert budget.used_minutes == pytest.approx(10**9 / 60)


def test_the_step_that_reaches_the_budget_is_the_last(clock):
    budget = TrainingBudget(max_minutes=1.0)
    verdicts = [play_step(clock, budget, train_s=25.0)[1] for _ in range(3)]
    assert verdicts == [False, False, True]  # 25, 50, 75 s against 60 s
    assert budget.spent and budget.used_minutes == pytest.approx(1.25)
    exact = TrainingBudget(max_minutes=1.0)
    assert [play_step(clock, exact, train_s=30.0)[1] for _ in range(2)] == [False, True]


def test_validation_does_not_count_and_saving_does(clock):
    budget = TrainingBudget(max_minutes=1.0)
    metrics, out_of_time = play_step(clock, budget, train_s=20.0, val_s=500.0)
    assert not out_of_time and budget.used_minutes == pytest.approx(20 / 60)
    assert metrics["timing_s/step"] == pytest.approx(520.0)  # the step's wall-clock
    assert step_train_seconds(metrics) == pytest.approx(20.0)  # re-derived from the line
    metrics, _ = play_step(clock, budget, train_s=20.0, save_s=15.0)  # the last save's cost
    assert budget.used_minutes == pytest.approx(55 / 60)
    assert metrics[TRAIN_MINUTES] == budget.used_minutes
    assert play_step(clock, budget, train_s=5.0, val_s=1000.0)[1]  # 60 s of training


def test_validation_cadence_does_not_change_how_many_steps_a_budget_buys(clock):
    def steps_until_spent(val_every: int) -> int:
        budget, step, out_of_time = TrainingBudget(max_minutes=2.0), 0, False
        while not out_of_time:
            step += 1
            val_s = 30.0 if step % val_every == 0 else 0.0
            out_of_time = play_step(clock, budget, train_s=10.0, val_s=val_s)[1]
        return step

    assert steps_until_spent(1) == steps_until_spent(5) == steps_until_spent(10**6) == 12


def test_lines_name_the_setting_the_step_and_the_way_on():
    budget = TrainingBudget(max_minutes=0.5, used_minutes=0.61)
    assert budget.stop_line(7) == (
        "trainer.max_minutes=0.5 reached at step 7 (0.61 minutes of training): the run stops there"
    )
    line = budget.spent_line(7)
    assert "\n" not in line and "raise trainer.max_minutes" in line and "--resume" in line


def test_train_minutes_are_logged_or_re_derived_from_step_timings():
    rows = [
        {"step": 0, "timing_s/validation": 50.0},  # validation before training: 0
        {"step": 1, "timing_s/step": 70.0, "timing_s/validation": 10.0},
        {"step": 2, "timing_s/step": 30.0, "perf/checkpoint_s": 30.0},
        {"step": 3, "timing_s/step": None},  # a null timing adds nothing
    ]
    assert train_minutes(rows) == pytest.approx([0.0, 1.0, 2.0, 2.0])
    # Logged values win; unlogged lines after them add on (a run resumed by older code).
    logged = [{"step": 1, TRAIN_MINUTES: 5.0}, {"step": 2, "timing_s/step": 60.0}]
    assert train_minutes(logged) == pytest.approx([5.0, 6.0])
    assert train_minutes([]) == []


def test_a_resumed_run_takes_its_minutes_from_the_checkpoint_or_its_metrics(tmp_path: Path):
    rows = [
        {"step": 1, "timing_s/step": 60.0},
        {"step": 2, "timing_s/step": 120.0},
        {"step": 3, "timing_s/step": 600.0},  # after the checkpoint: not counted
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert resumed_minutes({STATE_KEY: 1.5}, tmp_path, step=2) == 1.5
    assert resumed_minutes({}, tmp_path, step=2) == pytest.approx(3.0)  # older checkpoint
    assert resumed_minutes({}, tmp_path / "no-metrics", step=2) == 0.0


def test_a_validation_that_reaches_stop_at_success_spends_the_budget():
    key = "val/bandit/success"
    budget = TrainingBudget(None, stop_at_success=0.9, success_key=key)
    assert not budget.validated(0, {key: 1.0})  # the start, before any training
    assert not budget.validated(1, {"rollout/success": 1.0})  # no validation this step
    assert not budget.validated(2, {key: 0.89}) and not budget.spent
    assert budget.validated(4, {key: 0.9}) and budget.spent
    assert not budget.out_of_time and budget.reached == (4, 0.9)
    assert budget.validated(6, {key: 0.5})  # stays reached: the run stopped at step 4
    assert budget.stop_line(4) == (
        "trainer.stop_at_success=0.9 reached at step 4 (validation success 90.0%): "
        "the run stops there"
    )
    line = budget.spent_line(4)
    assert "\n" not in line and "raise trainer.stop_at_success" in line and "--resume" in line
    never = TrainingBudget(None, success_key=key)  # no target: validation never stops it
    assert not never.validated(3, {key: 1.0})


def test_a_resumed_run_finds_the_validation_that_reached_its_target(tmp_path: Path):
    key = "val/bandit/success"
    rows = [
        {"step": 0, key: 0.99},  # before training: never a stop
        {"step": 2, "timing_s/step": 60.0, key: 0.5},
        {"step": 4, "timing_s/step": 60.0, key: 0.96},
        {"step": 6, "timing_s/step": 60.0, key: 0.97},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    budget = TrainingBudget(None, stop_at_success=0.95, success_key=key)
    budget.resume({STATE_KEY: 2.0}, tmp_path, step=4)
    assert budget.used_minutes == 2.0 and budget.reached == (4, 0.96)
    earlier = TrainingBudget(None, stop_at_success=0.95, success_key=key)
    earlier.resume({}, tmp_path, step=2)  # a checkpoint before it: train on
    assert not earlier.spent and earlier.used_minutes == pytest.approx(1.0)


def test_time_left_is_the_median_recent_step_times_the_steps_left_at_most_the_budget():
    from starpo.timing import time_left

    assert time_left([], 10, None) is None  # nothing timed yet
    # One slow step (it also validated) does not swing the estimate: the median is 60 s.
    assert time_left([60.0, 61.0, 300.0, 59.0], 10, None) == pytest.approx(605.0)
    assert time_left([60.0], 10, budget_seconds_left=120.0) == 120.0  # the budget ends first
    assert time_left([60.0], 0, None) == 0.0


@pytest.mark.parametrize(
    ("seconds", "text"), [(42.4, "42 s"), (89, "89 s"), (1020, "17 min"), (27720, "7.7 h")]
)
def test_durations_read_in_the_unit_a_person_would_say(seconds, text):
    from starpo.timing import format_duration

    assert format_duration(seconds) == text


def test_the_budget_says_how_many_training_seconds_it_leaves():
    assert TrainingBudget(None).seconds_left is None
    assert TrainingBudget(10.0, used_minutes=7.5).seconds_left == 150.0
    assert TrainingBudget(10.0, used_minutes=12.0).seconds_left == 0.0
