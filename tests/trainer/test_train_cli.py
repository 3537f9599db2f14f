"""`starpo train` as a user runs it: a preset, overrides, a local model folder, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file


def starpo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "starpo", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_train_cli_runs_the_smoke_preset_and_resumes(tmp_path: Path, tiny_model_dir: Path):
    out = tmp_path / "run"
    args = [
        "train",
        "--config",
        "cpu-tiny-smoke",
        f"model.name={tiny_model_dir}",
        "trainer.total_steps=2",
        "trainer.save_every=1",
        "trainer.tensorboard=true",
        "--out",
        str(out),
        "--quiet",
    ]
    result = starpo(*args)
    assert result.returncode == 0, result.stderr
    assert "validation at step" in result.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # the smoke preset skips validation at step 0
    assert "val/bandit/success" in rows[-1] and "critic/vf_loss" in rows[-1]
    assert list((out / "tensorboard").iterdir())
    assert (out / "trajectories" / "step_000001.jsonl").is_file()
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step_000002"]  # keep_checkpoints: 1
    initial = load_file(tiny_model_dir / "model.safetensors")
    final = load_file(out / "final" / "model.safetensors")
    assert any(not (initial[k] == final[k]).all() for k in initial)  # parameters changed
    # Resuming a finished run has nothing left to do and keeps the metrics as they were.
    again = starpo("train", "--resume", "--out", str(out), "--quiet")
    assert again.returncode == 0, again.stderr
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert resumed == rows
    # The same command again (a scheduler's restart) refuses the finished run's folder ...
    refused = starpo(*args)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    # ... and with --resume auto it continues from the checkpoint (nothing left to do).
    again = starpo(*args, "--resume", "auto")
    assert again.returncode == 0, again.stderr
    assert "--resume auto: continuing from" in again.stderr and "step_000002" in again.stderr
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert resumed == rows


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("optim.actor_lr=-1", "optim.actor_lr"),
        ("filter.ratio=1.5", "filter.ratio"),
        ("optim.actor_learning_rate=1e-5", "did you mean 'optim.actor_lr'"),
        ("algorithm.adv_estimator=grpo", "group_size"),  # with rollout.group_size=1 below
        ("optim.mini_batch_size=3", "mini_batch_size"),
        ("model.name=./no/such/model", "does not exist"),
        ("env.id=sokobn", "did you mean 'sokoban'"),
    ],
)
def test_bad_configs_stop_before_any_work(tmp_path: Path, override: str, fragment: str):
    extra = ["rollout.group_size=1", "optim.mini_batch_size=1"] if "grpo" in override else []
    result = starpo(
        "train",
        "--config",
        "cpu-tiny-smoke",
        *extra,
        override,
        "--out",
        str(tmp_path / "run"),
        "--quiet",
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_missing_config_file_is_one_line(tmp_path: Path):
    result = starpo("train", "--config", "no-such-preset", "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and "not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_train_help_lists_every_option():
    from starpo.config import config_help

    result = starpo("train", "--help")
    assert result.returncode == 0
    for key, _, help_text in config_help():
        assert key in result.stdout
        assert help_text.split()[0] in result.stdout
