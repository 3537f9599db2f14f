"""RunLogger: metrics.jsonl, resume truncation, TensorBoard, W&B, trajectory files."""

from __future__ import annotations

import json
import math
import sys

import pytest

from starpo.errors import UserError
from starpo.runs.metrics import read_metrics
from starpo.trainer.sinks import (
    JsonlSink,
    RunLogger,
    Sink,
    TensorBoardSink,
    WandbSink,
    format_step_line,
)
from starpo.types import Trajectory


def _lines(path):
    return path.read_text().splitlines()


def test_metrics_jsonl_one_flushed_line_per_step(tmp_path):
    with RunLogger(tmp_path) as logger:
        logger.log(1, {"rollout/success": 0.25, "losses/pg": -0.5, "count": 3})
        # Flushed before close: a crash right now loses nothing.
        assert json.loads(_lines(tmp_path / "metrics.jsonl")[0])["step"] == 1
        logger.log(2, {"rollout/success": 0.5})
    assert read_metrics(tmp_path) == [
        {"step": 1, "rollout/success": 0.25, "losses/pg": -0.5, "count": 3},
        {"step": 2, "rollout/success": 0.5},
    ]


def test_non_finite_values_are_null(tmp_path):
    with RunLogger(tmp_path) as logger:
        logger.log(1, {"a": math.nan, "b": math.inf, "c": 1.5})
    text = (tmp_path / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"step": 1, "a": None, "b": None, "c": 1.5}


def test_step_is_a_reserved_metric_name(tmp_path):
    with RunLogger(tmp_path) as logger, pytest.raises(ValueError, match="reserved"):
        logger.log(1, {"step": 3.0})


def test_resume_truncates_to_equal_an_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    with RunLogger(straight) as logger:
        for step in range(1, 6):
            logger.log(step, {"x": float(step)})
    with RunLogger(resumed) as logger:  # crashes after step 4, checkpoint at step 2
        for step in range(1, 5):
            logger.log(step, {"x": float(step)})
    with open(resumed / "metrics.jsonl", "a") as file:
        file.write('{"step": 5, "x"')  # killed mid-line
    with RunLogger(resumed, resume=True) as logger:
        logger.truncate_after(2)
        for step in range(3, 6):
            logger.log(step, {"x": float(step)})
    assert (resumed / "metrics.jsonl").read_bytes() == (straight / "metrics.jsonl").read_bytes()


def test_fresh_run_starts_over(tmp_path):
    with RunLogger(tmp_path) as logger:
        logger.log(1, {"x": 1.0})
        logger.log_validation_trajectories(1, [Trajectory(env_id="e", seed=0, group=0)])
    with RunLogger(tmp_path) as logger:
        logger.log(1, {"x": 2.0})
    assert read_metrics(tmp_path) == [{"step": 1, "x": 2.0}]
    assert not (tmp_path / "val_trajectories").exists()


def test_read_metrics_rejects_a_broken_middle_line(tmp_path):
    assert read_metrics(tmp_path) == []
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{oops\n{"step": 3}\n')
    with pytest.raises(UserError, match="metrics.jsonl:2"):
        read_metrics(tmp_path)


def test_resume_reports_the_half_written_line_it_drops(tmp_path, capsys):
    with RunLogger(tmp_path) as logger:
        logger.log(1, {"x": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as file:
        file.write('{"step": 2, "x"')
    assert read_metrics(tmp_path) == [{"step": 1, "x": 1.0}]  # skipped by readers too
    with RunLogger(tmp_path, resume=True) as logger:
        logger.truncate_after(1)
    assert _lines(tmp_path / "metrics.jsonl") == ['{"step": 1, "x": 1.0}']
    err = capsys.readouterr().err
    assert "warning:" in err and "metrics.jsonl" in err and "half-written" in err


class _RecordingSink:
    """A sink that remembers its calls: what a new destination has to implement."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def log(self, step, metrics):
        self.calls.append(("log", step, dict(metrics)))

    def truncate_after(self, step):
        self.calls.append(("truncate_after", step))

    def close(self):
        self.calls.append(("close",))


def test_every_sink_in_the_list_gets_each_step(tmp_path):
    members = [m for m in vars(Sink) if not m.startswith("_")]
    assert sorted(members) == ["close", "log", "truncate_after"]
    for cls in (JsonlSink, TensorBoardSink, WandbSink, _RecordingSink):
        assert all(callable(getattr(cls, m)) for m in members), cls
    sink = _RecordingSink()
    with RunLogger(tmp_path) as logger:
        assert [type(s).__name__ for s in logger.sinks] == ["JsonlSink"]
        logger.sinks.append(sink)
        logger.log(3, {"a": math.nan, "b": 2})
        logger.truncate_after(2)
    assert sink.calls == [
        ("log", 3, {"a": None, "b": 2}),  # the same JSON-safe values metrics.jsonl gets
        ("truncate_after", 2),
        ("close",),
    ]
    assert read_metrics(tmp_path) == []


def test_tensorboard_scalars_and_resume_purge(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, sinks=["tensorboard"]) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"rollout/reward": float(step), "bad": math.nan})
    with RunLogger(tmp_path, sinks=["tensorboard"], resume=True) as logger:
        logger.truncate_after(1)
        logger.log(2, {"rollout/reward": 20.0})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert "bad" not in events.Tags()["scalars"]  # non-finite values are skipped
    assert [(e.step, e.value) for e in events.Scalars("rollout/reward")] == [(1, 1.0), (2, 20.0)]


def test_missing_tensorboard_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(UserError, match="pip install tensorboard"):
        RunLogger(tmp_path, sinks=["tensorboard"])


def test_missing_wandb_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    with pytest.raises(UserError, match="W&B logging needs the wandb package: pip install wandb"):
        RunLogger(tmp_path, sinks=["wandb"])


def _wandb_config(mode: str) -> dict:
    return {"trainer": {"wandb_mode": mode, "wandb_project": "starpo-test"}}


def test_unknown_wandb_mode_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="offline"):
        RunLogger(tmp_path, sinks=["wandb"], config=_wandb_config("offlin"))


def test_wandb_offline_run_lives_in_run_dir_and_resumes_its_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed; its UserError path is tested")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    with RunLogger(
        run_dir, sinks=["wandb"], config={**_wandb_config("offline"), "lr": 1e-6}
    ) as logger:
        logger.log(1, {"rollout/reward": 0.5, "bad": math.nan})
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    assert list((run_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    with RunLogger(
        run_dir, sinks=["wandb"], config=_wandb_config("offline"), resume=True
    ) as logger:
        logger.log(2, {"rollout/reward": 0.7})
    assert (run_dir / "wandb_id.txt").read_text().strip() == run_id


def test_trajectory_files_respect_the_limit(tmp_path):
    batch = [Trajectory(env_id="bandit", seed=i, group=i // 4) for i in range(16)]
    with RunLogger(tmp_path) as logger:
        path = logger.log_trajectories(10, batch, limit=4)
        val = logger.log_validation_trajectories(10, batch)
        assert logger.log_trajectories(11, batch, limit=0) is None
    assert path == tmp_path / "trajectories" / "step_000010.jsonl"
    sampled = [Trajectory.from_json(line) for line in _lines(path)]
    assert [t.seed for t in sampled] == [0, 4, 8, 12]  # spread over the groups
    assert val == tmp_path / "val_trajectories" / "step_000010.jsonl"
    assert [Trajectory.from_json(line).seed for line in _lines(val)] == list(range(16))
    with RunLogger(tmp_path) as logger:
        assert len(_lines(logger.log_trajectories(1, batch[:2], limit=8))) == 2


def test_resume_drops_trajectory_files_after_the_checkpoint(tmp_path):
    batch = [Trajectory(env_id="bandit", seed=0, group=0)]
    with RunLogger(tmp_path) as logger:
        for step in (5, 10):
            logger.log_trajectories(step, batch, limit=1)
    with RunLogger(tmp_path, resume=True) as logger:
        logger.truncate_after(5)
    assert [p.name for p in (tmp_path / "trajectories").iterdir()] == ["step_000005.jsonl"]


def test_format_step_line():
    metrics = {"rollout/success": 0.25, "rollout/reward": 0.125, "losses/kl": 3e-5, "n": 7}
    line = format_step_line(
        3, 20, metrics, ["rollout/success", "rollout/reward", "missing"], elapsed_s=41.23
    )
    assert line == "step 3/20 | success 0.25 | reward 0.12 | 41.2s"
    assert format_step_line(1, 2, metrics, {"kl": "losses/kl", "n": "n"}) == (
        "step 1/2 | kl 3.00e-05 | n 7"
    )
    assert format_step_line(1, 2, {"x": None}, ["x"]) == "step 1/2 | x nan"
    with_left = format_step_line(3, 20, metrics, ["n"], left_s=27720.0)
    assert with_left == "step 3/20 | n 7 | left ~7.7 h"
    assert "left" not in format_step_line(20, 20, metrics, ["n"], left_s=0.0)  # the last
