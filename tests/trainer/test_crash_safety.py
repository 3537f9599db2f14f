"""Crash safety, tested by force: `starpo train` is SIGKILLed at random moments and resumed.

Each trial runs the same command a job scheduler would rerun after a preemption
(`starpo train ... --resume auto`), kills it with SIGKILL after a random delay (during
start-up, a step, a validation or a checkpoint write), then reruns it until it finishes.
The finished run must equal an unbroken one: every step logged exactly once, no torn or
duplicate metrics line, and the same metrics (timings aside) and final weights.

`make test` runs STARPO_CRASH_TRIALS=2 (default); `make test-crash` runs 10.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_metrics import comparable
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # training subprocesses

TRIALS = int(os.environ.get("STARPO_CRASH_TRIALS", "2"))
STEPS = 4
RUN_TIMEOUT_S = 300


def _command(model_dir: Path, out: Path, checkpoint_async: bool = False) -> list[str]:
    return [
        sys.executable, "-m", "starpo", "train", "--config", "cpu-tiny-smoke",
        f"model.name={model_dir}", f"trainer.total_steps={STEPS}", "trainer.save_every=1",
        "trainer.keep_checkpoints=2", "trainer.val_every=2", "trainer.tensorboard=false",
        f"trainer.checkpoint_async={str(checkpoint_async).lower()}",
        "--out", str(out), "--quiet", "--resume", "auto",
    ]  # fmt: skip


def _run(command: list[str]) -> float:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    return time.monotonic() - started


def _run_and_kill(command: list[str], after_s: float, out: Path, after_steps: int = 0) -> bool:
    """Start `command`; once `after_steps` steps are logged, wait `after_s` and SIGKILL it.
    Returns whether it was killed (it may finish first)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    metrics = out / "metrics.jsonl"
    while after_steps and time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and metrics.read_bytes().count(b"\n") >= after_steps:
            break
        time.sleep(0.05)
    try:
        process.wait(timeout=after_s)
        return False
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        return True


def _metrics(out: Path) -> list[dict]:
    raw = (out / "metrics.jsonl").read_bytes()
    assert raw.endswith(b"\n"), "the last metrics line is torn"
    rows = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    return comparable(rows)


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory, tiny_model_dir: Path) -> tuple[float, list[dict], dict]:
    """The unbroken synchronous run both variants must equal, run once for the module:
    (its seconds, its metrics, its final weights)."""
    straight = tmp_path_factory.mktemp("straight")
    unbroken_s = _run(_command(tiny_model_dir, straight))
    expected = _metrics(straight)
    assert [r["step"] for r in expected] == list(range(1, STEPS + 1))
    return unbroken_s, expected, load_file(straight / "final" / "model.safetensors")


@pytest.mark.parametrize("checkpoint_async", [False, True], ids=["sync", "async"])
def test_runs_killed_at_random_moments_resume_to_the_unbroken_result(
    tmp_path: Path, tiny_model_dir: Path, unbroken, checkpoint_async: bool
):
    """With trainer.checkpoint_async a kill may also land while a background write is in
    flight; the unbroken run it must equal is a synchronous one."""
    unbroken_s, expected, final = unbroken
    chooser = random.Random(1234)
    for trial in range(TRIALS):
        out = tmp_path / f"trial-{trial}"
        command = _command(tiny_model_dir, out, checkpoint_async)
        if trial == 0:  # surely mid-training: after the first logged step
            kill_at = chooser.uniform(0.0, 1.0)
            assert _run_and_kill(command, kill_at, out, after_steps=1), "finished before the kill"
        else:  # anywhere from start-up to the end
            kill_at = chooser.uniform(0.3, unbroken_s)
            _run_and_kill(command, kill_at, out)
        if chooser.random() < 0.5:  # sometimes the first resume is killed as well
            _run_and_kill(command, chooser.uniform(0.3, unbroken_s), out)
        _run(command)
        rows = _metrics(out)
        steps = [r["step"] for r in rows]
        assert steps == list(range(1, STEPS + 1)), (trial, kill_at, steps)  # none lost or twice
        assert rows == expected, (trial, kill_at)
        got = load_file(out / "final" / "model.safetensors")
        assert all((got[k] == final[k]).all() for k in final), (trial, kill_at)
        leftovers = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
        assert leftovers == [], (trial, kill_at)  # no half-written checkpoint left behind
