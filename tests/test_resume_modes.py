"""`starpo train` in a folder: --resume, --resume auto (restart loops), --overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from starpo.cli import parse_args
from starpo.cli.train import start_or_resume
from starpo.errors import UserError
from starpo.runs import RunFolder
from starpo.trainer.checkpoints.store import save_checkpoint


def _old_run(out: Path, *, checkpoint: bool) -> None:
    """A folder as an earlier run leaves it: config, metrics, a trajectory file, a final
    model and (optionally) one complete checkpoint."""
    out.mkdir(parents=True)
    (out / "config.yaml").write_text("trainer: {total_steps: 2}\n")
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "trajectories").mkdir()
    (out / "trajectories" / "step_000001.jsonl").write_text("{}\n")
    (out / "final").mkdir()
    if checkpoint:
        save_checkpoint(out, 1, {"step": 1, "w": torch.zeros(2)}, keep=2)


def test_a_new_folder_starts_fresh_silently(tmp_path: Path):
    assert start_or_resume(tmp_path / "new", None, overwrite=False) == (False, None)


def test_a_folder_holding_a_run_is_refused_naming_both_ways_out(tmp_path: Path):
    out = tmp_path / "run"
    _old_run(out, checkpoint=True)
    with pytest.raises(UserError) as refused:
        start_or_resume(out, None, overwrite=False)
    message = str(refused.value)
    assert "already holds a run" in message and "metrics.jsonl" in message
    assert "--resume" in message and "--resume auto" in message and "--overwrite" in message
    assert "\n" not in message
    assert (out / "metrics.jsonl").is_file() and RunFolder(out).checkpoints.is_dir()  # kept


def test_overwrite_removes_the_earlier_runs_outputs_only(tmp_path: Path):
    out = tmp_path / "run"
    _old_run(out, checkpoint=True)
    (out / "notes.txt").write_text("mine")
    resume, said = start_or_resume(out, None, overwrite=True)
    assert resume is False and "--overwrite: removed" in said and "checkpoints" in said
    assert RunFolder(out).holds_run() == []
    assert (out / "notes.txt").read_text() == "mine"  # not a run output: left alone


def test_resume_auto_continues_from_a_checkpoint(tmp_path: Path):
    out = tmp_path / "run"
    _old_run(out, checkpoint=True)
    resume, said = start_or_resume(out, "auto", overwrite=False)
    assert resume is True and "continuing from" in said and "step_000001" in said
    assert (out / "metrics.jsonl").is_file()


def test_resume_auto_without_a_checkpoint_starts_fresh_and_says_so(tmp_path: Path):
    out = tmp_path / "run"
    _old_run(out, checkpoint=False)  # a run killed before its first checkpoint
    resume, said = start_or_resume(out, "auto", overwrite=False)
    assert resume is False and "no checkpoint" in said and "starting fresh" in said
    assert RunFolder(out).holds_run() == []
    assert start_or_resume(tmp_path / "empty", "auto", overwrite=False)[0] is False


def test_plain_resume_stays_strict(tmp_path: Path):
    assert start_or_resume(tmp_path / "run", "latest", overwrite=False) == (True, None)


@pytest.mark.parametrize(
    ("argv", "mode", "overrides"),
    [
        (["--out", "r"], None, []),
        (["--resume", "--out", "r"], "latest", []),
        (["--out", "r", "--resume"], "latest", []),
        (["--resume", "auto", "--out", "r"], "auto", []),
        (["--out", "r", "--resume", "trainer.total_steps=3"], "latest", ["trainer.total_steps=3"]),
        (["--out", "r", "a.b=1", "--resume", "c.d=2", "e=3"], "latest", ["a.b=1", "c.d=2", "e=3"]),
    ],
)
def test_resume_flag_forms(argv, mode, overrides):
    args = parse_args(["train", *argv])
    assert args.resume == mode
    assert args.overrides == overrides  # an override after --resume stays one, in order


def test_an_unknown_resume_mode_is_refused():
    with pytest.raises(SystemExit):
        parse_args(["train", "--out", "r", "--resume=sometimes"])
