"""trainer.max_minutes and trainer.stop_at_success end to end on tiny models: the budget
stops a run after the step that spends it (validated, checkpointed, exported), changes
none of the metrics of the steps that ran, and counts across --resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from run_metrics import comparable

from starpo import timing
from starpo.runs.metrics import read_metrics
from starpo.timing import TRAIN_MINUTES
from starpo.trainer.checkpoints import saver
from starpo.trainer.checkpoints.store import latest_checkpoint, load_checkpoint
from starpo.trainer.loop import Trainer

pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs


class TickingClock:
    """`time.perf_counter` for `starpo.timing.Timer`: one second more at every reading, so
    every step takes the same (fake) time and a budget stops runs at a known step."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def _steps(run: Path) -> list[int]:
    return [row["step"] for row in read_metrics(run)]


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def _without_validation(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("val/")}


def test_budget_stops_after_its_step_and_resume_counts_on(
    tmp_path: Path, monkeypatch, bigram_model, make_bandit_config, capsys
):
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=TickingClock().perf_counter))
    # Saves cost no time: the budgeted run saves off cadence at step 3, which the unbroken
    # run does not, so real save times (longer on a busy machine) would tell them apart.
    monkeypatch.setattr(saver, "time", SimpleNamespace(perf_counter=lambda: 0.0))
    extra = {"trainer.val_every": "2", "trainer.val_seeds": "8", "trainer.save_every": "2"}

    def train(run: Path, max_minutes: str, resume: bool = False) -> list[dict]:
        cfg = make_bandit_config(
            "grpo", total_steps=6, **extra, **{"trainer.max_minutes": max_minutes}
        )
        model, tokenizer = bigram_model()
        trainer = Trainer(cfg, run, resume=resume, model=model, tokenizer=tokenizer)
        return trainer.train()

    straight = tmp_path / "straight"
    train(straight, "null")
    expected = read_metrics(straight)
    minutes = {row["step"]: row[TRAIN_MINUTES] for row in expected if row["step"]}
    assert minutes[1] > 0 and all(minutes[s] > minutes[s - 1] for s in range(2, 7))
    budget = (minutes[2] + minutes[3]) / 2  # step 3 spends it

    run = tmp_path / "budget"
    history = train(run, repr(budget))
    assert _steps(run) == [0, 1, 2, 3]
    assert "val/bandit/success" in history[-1]  # validated at its last step (off cadence)
    assert _checkpoints(run) == ["step_000002", "step_000003"]
    assert (run / "final" / "config.json").is_file()
    assert f"trainer.max_minutes={budget:g} reached at step 3" in capsys.readouterr().err
    # The steps that ran logged what the unbudgeted run logged (plus step 3's validation).
    got = comparable(read_metrics(run))
    assert got[:3] == comparable(expected)[:3]
    assert _without_validation(got[3]) == comparable(expected)[3]
    state = load_checkpoint(latest_checkpoint(run))["trainer_state"]
    assert state["train_minutes"] == read_metrics(run)[-1][TRAIN_MINUTES] >= budget

    # Resumed with the budget spent: one line, nothing trained, the export still there.
    final = (run / "final" / "config.json").read_text()
    assert train(run, repr(budget), resume=True) == []
    said = capsys.readouterr().err.splitlines()
    assert [line for line in said if "max_minutes" in line] == [
        f"trainer.max_minutes={budget:g} was spent by step 3 "
        f"({state['train_minutes']:.2f} minutes of training): nothing left to train; to go "
        "on, raise trainer.max_minutes (or set it to null) and --resume"
    ]
    assert _steps(run) == [0, 1, 2, 3] and (run / "final" / "config.json").read_text() == final

    # A raised budget goes on from the minutes already used: step 5 spends it.
    more = (minutes[4] + minutes[5]) / 2
    train(run, repr(more), resume=True)
    assert _steps(run) == [0, 1, 2, 3, 4, 5]
    resumed = read_metrics(run)
    assert comparable(resumed)[4] == comparable(expected)[4]
    assert _without_validation(comparable(resumed)[5]) == comparable(expected)[5]
    for row in resumed[4:]:  # cumulative, as in the unbroken run
        assert row[TRAIN_MINUTES] == pytest.approx(minutes[row["step"]])


def test_stop_at_success_ends_the_run_at_the_first_validation_that_reaches_it(
    tmp_path: Path, bigram_model, make_bandit_config, capsys
):
    extra = {"trainer.val_every": "2", "trainer.val_seeds": "16", "trainer.save_every": "3"}

    def train(run: Path, target: str, resume: bool = False) -> list[dict]:
        settings = {**extra, "trainer.stop_at_success": target}
        cfg = make_bandit_config("grpo", total_steps=6, **settings)
        model, tokenizer = bigram_model()
        return Trainer(cfg, run, resume=resume, model=model, tokenizer=tokenizer).train()

    straight = tmp_path / "straight"
    train(straight, "null")
    expected = read_metrics(straight)
    target, stop = expected[2]["val/bandit/success"], 2  # step 2 validates first
    assert expected[2]["step"] == 2 and target > 0, "no success at step 2: no target"

    run = tmp_path / "early"
    train(run, repr(target))
    assert _steps(run) == list(range(stop + 1))
    assert comparable(read_metrics(run)) == comparable(expected)[: stop + 1]
    assert f"step_{stop:06d}" in _checkpoints(run)  # saved off its cadence when it stops
    assert (run / "final" / "config.json").is_file()
    assert f"trainer.stop_at_success={target:g} reached at step {stop}" in capsys.readouterr().err
    assert train(run, repr(target), resume=True) == []  # reached: nothing left to train
    assert "nothing left to train" in capsys.readouterr().err
    assert _steps(run) == list(range(stop + 1))


def test_cli_budget_stops_early_and_a_spent_resume_exits_cleanly(
    tmp_path: Path, tiny_model_dir: Path
):
    out = tmp_path / "run"

    def starpo(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "starpo", "train", *args, "--out", str(out)]
        return subprocess.run(command, capture_output=True, text=True, timeout=600)

    first = starpo(
        "--config",
        "cpu-tiny-smoke",
        f"model.name={tiny_model_dir}",
        "trainer.total_steps=3",
        "trainer.max_minutes=1e-6",  # any step spends it
    )
    assert first.returncode == 0, first.stderr
    assert "trainer.max_minutes=1e-06 reached at step 1" in first.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert "val/bandit/success" in rows[0]  # the smoke preset validates at step 2 otherwise
    assert rows[0][TRAIN_MINUTES] > 0
    assert _checkpoints(out) == ["step_000001"]
    assert (out / "final" / "model.safetensors").is_file()

    again = starpo("--resume")
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stderr.splitlines() if "max_minutes" in line]
    assert len(said) == 1 and "was spent by step 1" in said[0], again.stderr
    assert "Traceback" not in again.stderr
    assert [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] == rows
    assert (out / "final" / "model.safetensors").is_file()
