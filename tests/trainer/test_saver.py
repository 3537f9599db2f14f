"""Background checkpoint writes (`trainer.checkpoint_async`): the snapshot, one write in
flight, errors raised at the next wait, and a kill mid-write leaving the previous one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from starpo.errors import UserError
from starpo.trainer.checkpoints import saver
from starpo.trainer.checkpoints.saver import BackgroundWriter, CheckpointSaver, Target, snapshot
from starpo.trainer.checkpoints.store import latest_checkpoint, load_checkpoint, save_checkpoint


def test_snapshot_is_not_changed_by_later_updates():
    weights = torch.zeros(4)
    state = {
        "optim": {"state": {0: {"exp_avg": weights, "step": torch.tensor(3.0)}}, "lr": [0.1]},
        "rng": (np.arange(3), 7),
        "items": ["a"],
    }
    copy = snapshot(state)
    weights.add_(1.0)  # what optimizer.step does to the live moments
    state["optim"]["state"][0]["step"] += 1
    state["optim"]["lr"][0] = 0.5
    state["rng"][0][0] = 99
    state["items"].append("b")
    assert torch.equal(copy["optim"]["state"][0]["exp_avg"], torch.zeros(4))
    assert copy["optim"]["state"][0]["step"].item() == 3.0 and copy["optim"]["lr"] == [0.1]
    assert copy["rng"][0].tolist() == [0, 1, 2] and copy["rng"][1] == 7
    assert copy["items"] == ["a"]


def test_a_snapshot_reuses_the_previous_ones_memory():
    def pointers(snap: dict) -> list[int]:
        return [t.data_ptr() for t in (snap["w"], snap["optim"][0]["m"], snap["pair"][0])]

    state = {"w": torch.randn(100), "optim": {0: {"m": torch.zeros(3)}}, "pair": (torch.ones(2),)}
    first = snapshot(state)
    before = pointers(first)
    state["w"].mul_(2.0)
    state["optim"][0]["m"].add_(5.0)
    second = snapshot(state, reuse=first)
    assert pointers(second) == before
    assert torch.equal(second["w"], state["w"]) and second["optim"][0]["m"].eq(5.0).all()
    state["w"] = torch.randn(7)  # another shape: new memory
    third = snapshot(state, reuse=second)
    assert third["w"].data_ptr() != before[0] and torch.equal(third["w"], state["w"])


def test_a_background_write_equals_a_synchronous_one(tmp_path):
    state = {"step": 2, "w": torch.randn(1000), "rng": (np.arange(5),)}
    sync = save_checkpoint(tmp_path / "sync", 2, state, keep=1)
    writer = BackgroundWriter()
    path = writer.start(2, snapshot(state), [Target(tmp_path / "async", keep=1)])
    written = writer.wait()
    assert written is not None and written.path == path and path.is_dir()
    assert written.bytes == sum(p.stat().st_size for p in path.iterdir())
    assert (path / "state.pt").read_bytes() == (sync / "state.pt").read_bytes()
    assert json.loads((path / "meta.json").read_text()) == json.loads(
        (sync / "meta.json").read_text()
    )
    assert writer.wait() is None  # reported once


def test_the_next_save_waits_for_the_write_in_flight(tmp_path, monkeypatch):
    events = []

    def logged_save(run_dir, step, state, keep, keep_every=0):
        events.append(("start", step))
        path = save_checkpoint(run_dir, step, state, keep, keep_every)
        events.append(("end", step))
        return path

    monkeypatch.setattr(saver, "save_checkpoint", logged_save)
    lines = []
    checkpoints = CheckpointSaver(background=True, say=lines.append)
    targets = [Target(tmp_path, keep=2)]
    for step in (1, 2):
        checkpoints.save(step, lambda s: {"step": s, "w": torch.full((10,), float(s))}, targets)
    checkpoints.wait()
    assert events == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert len(lines) == 2 and "step_000001" in lines[0] and "in the background" in lines[0]
    cost = checkpoints.take_cost()
    assert set(cost) == {"perf/checkpoint_s", "perf/checkpoint_write_s", "perf/checkpoint_mb"}
    assert checkpoints.take_cost() == {}  # once
    assert torch.equal(load_checkpoint(latest_checkpoint(tmp_path))["w"], torch.full((10,), 2.0))
    writer = BackgroundWriter()  # on its own, the writer refuses a second write before wait()
    writer.start(3, {"step": 3}, targets)
    with pytest.raises(RuntimeError, match="in flight"):
        writer.start(4, {"step": 4}, targets)
    writer.wait()


def test_a_failed_background_write_is_one_line_at_the_next_wait(tmp_path, monkeypatch, capsys):
    first = save_checkpoint(tmp_path, 1, {"step": 1}, keep=2)

    def disk_full(run_dir, step, state, keep, keep_every=0):
        raise OSError(28, "No space left on device\nmore detail")

    monkeypatch.setattr(saver, "save_checkpoint", disk_full)
    writer = BackgroundWriter()
    writer.start(2, {"step": 2}, [Target(tmp_path, keep=2)])
    with pytest.raises(UserError) as raised:
        writer.wait()
    message = str(raised.value)
    assert "\n" not in message
    assert "checkpoint " in message and "step_000002 was not written" in message
    assert "[Errno 28] No space left on device" in message and "--resume" in message
    assert writer.wait() is None  # raised once, then gone
    assert latest_checkpoint(tmp_path) == first

    writer.start(3, {"step": 3}, [Target(tmp_path, keep=2)])  # poll raises it too
    writer._thread.join()
    with pytest.raises(UserError, match="step_000003 was not written"):
        writer.poll()

    writer.start(4, {"step": 4}, [Target(tmp_path, keep=2)])  # close() only warns
    writer.close()
    assert "warning: checkpoint" in capsys.readouterr().err


KILLED_MID_WRITE = """
    import os, signal, sys, time
    from pathlib import Path
    import torch
    from starpo.trainer.checkpoints import store as checkpoint
    from starpo.trainer.checkpoints.saver import BackgroundWriter, Target

    run_dir = Path(sys.argv[1])
    checkpoint.save_checkpoint(run_dir, 1, {"w": torch.zeros(1000)}, keep=2)
    write = checkpoint._HashingWriter.write

    def write_then_die(self, data):
        written = write(self, data)
        if memoryview(data).nbytes > 1_000_000:  # the tensor's bytes are on disk, the rest not
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    checkpoint._HashingWriter.write = write_then_die
    BackgroundWriter().start(2, {"w": torch.ones(1_000_000)}, [Target(run_dir, keep=2)])
    time.sleep(60)  # the main thread trains on; the kill comes from the writer thread
"""


def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED_MID_WRITE))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    temps = [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
    assert len(temps) == 1 and (temps[0] / "state.pt").stat().st_size > 4_000_000
    previous = latest_checkpoint(tmp_path)
    assert previous is not None and previous.name == "step_000001"
    assert torch.equal(load_checkpoint(previous)["w"], torch.zeros(1000))
    save_checkpoint(tmp_path, 3, {"w": torch.ones(3)}, keep=2)  # sweeps the dead one's temp
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000001", "step_000003"]
