"""Checkpoints: RNG round trip, atomic saves, pruning, and rejection of broken ones."""

from __future__ import annotations

import hashlib
import json
import os
import random

import numpy as np
import pytest
import torch

from starpo.errors import UserError
from starpo.trainer.checkpoints import store as ckpt
from starpo.trainer.checkpoints.store import (
    capture_rng_state,
    checkpoint_step,
    find_resume_point,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)


def _draws(generator: torch.Generator) -> tuple:
    return (
        random.random(),
        np.random.rand(3).tolist(),
        torch.rand(3).tolist(),
        torch.rand(3, generator=generator).tolist(),
    )


def test_rng_state_round_trip_repeats_the_same_draws():
    generator = torch.Generator().manual_seed(7)
    _draws(generator)  # move away from the seeds
    state = capture_rng_state({"sampler": generator})
    first = _draws(generator)
    _draws(generator)
    restore_rng_state(state, {"sampler": generator})
    assert _draws(generator) == first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rng_state_round_trip():
    generator = torch.Generator(device="cuda").manual_seed(3)
    state = capture_rng_state({"cuda_sampler": generator})
    first = (
        torch.rand(3, device="cuda").tolist(),
        torch.rand(3, generator=generator, device="cuda").tolist(),
    )
    restore_rng_state(state, {"cuda_sampler": generator})
    again = (
        torch.rand(3, device="cuda").tolist(),
        torch.rand(3, generator=generator, device="cuda").tolist(),
    )
    assert again == first


def test_rng_restore_needs_the_same_generator_names():
    state = capture_rng_state({"sampler": torch.Generator()})
    with pytest.raises(ValueError, match="sampler"):
        restore_rng_state(state, {})


def _tiny_training_state(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, optimizer


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.ones(3, 4)).pow(2).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_save_load_round_trip_continues_training_identically(tmp_path):
    model, optimizer = _tiny_training_state(0)
    _train_step(model, optimizer)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": capture_rng_state(),
        "step": 1,
        "config": {"lr": 0.1, "env": "bandit"},
    }
    folder = save_checkpoint(tmp_path, 1, state, keep=3)
    assert folder == tmp_path / "checkpoints" / "step_000001"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["step"] == 1 and meta["format"] == 1
    assert meta["files"] == {"state.pt": (folder / "state.pt").stat().st_size}
    assert latest_checkpoint(tmp_path) == folder == find_resume_point(tmp_path)
    assert checkpoint_step(folder) == 1

    loaded = load_checkpoint(folder)
    assert loaded["config"] == state["config"] and loaded["step"] == 1
    clone, clone_optimizer = _tiny_training_state(1)  # different init, overwritten below
    clone.load_state_dict(loaded["model"])
    clone_optimizer.load_state_dict(loaded["optimizer"])
    _train_step(model, optimizer)
    _train_step(clone, clone_optimizer)
    for a, b in zip(model.parameters(), clone.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_recorded_hash_is_the_written_files(tmp_path):
    """The SHA-256 is computed from the bytes as torch.save writes them (no re-read); it
    must equal the file's, for tensors of several sizes and plain objects."""
    state = {
        "big": torch.randn(300_000),
        "small": [torch.arange(3), torch.zeros(0)],
        "rng": capture_rng_state(),
        "text": "ü" * 1000,
    }
    folder = save_checkpoint(tmp_path, 4, state, keep=1)
    meta = json.loads((folder / "meta.json").read_text())
    on_disk = hashlib.sha256((folder / "state.pt").read_bytes()).hexdigest()
    assert meta["sha256"] == {"state.pt": on_disk}
    assert torch.equal(load_checkpoint(folder)["big"], state["big"])


def _steps(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def test_keep_prunes_older_checkpoints_and_resaving_replaces(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {"step": step}, keep=2)
    assert _steps(tmp_path) == ["step_000020", "step_000030"]
    save_checkpoint(tmp_path, 30, {"step": 30, "again": True}, keep=2)
    assert _steps(tmp_path) == ["step_000020", "step_000030"]  # no temp folders left
    assert load_checkpoint(latest_checkpoint(tmp_path))["again"] is True
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, 40, {}, keep=0)


def test_keep_every_keeps_those_steps_for_good(tmp_path):
    for step in range(5, 45, 5):
        save_checkpoint(tmp_path, step, {"step": step}, keep=2, keep_every=20)
    # The newest two, plus every older multiple of 20.
    assert _steps(tmp_path) == ["step_000020", "step_000035", "step_000040"]
    assert latest_checkpoint(tmp_path).name == "step_000040"  # resume is unchanged


def test_crash_while_writing_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    first = save_checkpoint(tmp_path, 1, {"step": 1}, keep=5)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.json, "dump", fail)  # after state.pt, before meta.json
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"step": 2}, keep=5)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == first
    assert _steps(tmp_path) == ["step_000001"]


def test_crash_before_the_rename_leaves_no_picked_checkpoint(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise KeyboardInterrupt  # complete files in the temp folder, never renamed

    monkeypatch.setattr(ckpt.os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 5, {"step": 5}, keep=5)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) is None
    # Temp folders of failed saves (ours, or a killed process's) are swept by the next save.
    (tmp_path / "checkpoints" / ".tmp-step_000006-999999999").mkdir()
    save_checkpoint(tmp_path, 7, {"step": 7}, keep=5)
    assert _steps(tmp_path) == ["step_000007"]


def test_resuming_sweeps_folders_a_killed_run_left_half_removed(tmp_path):
    """A kill while an old checkpoint is deleted leaves `.old-step_N-PID`; a resumed run may
    finish without saving again, so finding the resume point sweeps them (found by CI)."""
    last = save_checkpoint(tmp_path, 2, {"step": 2}, keep=1)
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / ".old-step_000001-999999999").mkdir()  # a dead process's
    (checkpoints / ".tmp-step_000003-999999999").mkdir()
    alive = checkpoints / f".tmp-step_000003-{os.getppid()}"  # a live process's: kept
    alive.mkdir()
    assert find_resume_point(tmp_path) == last
    assert sorted(p.name for p in checkpoints.iterdir()) == [alive.name, "step_000002"]


def test_truncated_state_is_skipped_with_one_warning(tmp_path, capsys):
    first = save_checkpoint(tmp_path, 1, {"w": torch.zeros(100)}, keep=5)
    second = save_checkpoint(tmp_path, 2, {"w": torch.ones(100)}, keep=5)
    data = (second / "state.pt").read_bytes()
    (second / "state.pt").write_bytes(data[: len(data) // 2])
    assert latest_checkpoint(tmp_path) == first
    assert latest_checkpoint(tmp_path) == first
    err = capsys.readouterr().err
    assert err.count("skipping corrupt checkpoint") == 1 and "step_000002" in err
    with pytest.raises(UserError, match="step_000002.*corrupt"):
        load_checkpoint(second)


def test_corrupt_state_of_the_right_size_fails_to_load(tmp_path):
    folder = save_checkpoint(tmp_path, 3, {"w": torch.arange(50.0)}, keep=5)
    size = (folder / "state.pt").stat().st_size
    (folder / "state.pt").write_bytes(b"\x00garbage" * (size // 8) + b"\x00" * (size % 8))
    assert latest_checkpoint(tmp_path) == folder  # sizes match: only loading can tell
    with pytest.raises(UserError, match=r"step_000003.*SHA-256.*delete it or resume"):
        load_checkpoint(folder)
    # Without a recorded hash, torch.load's own failure becomes the same kind of error.
    meta = json.loads((folder / "meta.json").read_text())
    del meta["sha256"]
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"state.pt is corrupt.*delete it or resume"):
        load_checkpoint(folder)


def test_find_resume_point_without_checkpoints(tmp_path):
    with pytest.raises(UserError, match="no checkpoint in .*checkpoints to resume from; start"):
        find_resume_point(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(UserError, match="without --resume"):
        find_resume_point(tmp_path)


def test_an_unwritable_run_folder_is_one_line_before_any_model_loads(tmp_path, monkeypatch):
    from starpo.config import load_config
    from starpo.trainer.checkpoints.store import check_writable
    from starpo.trainer.loop import Trainer

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match=r"cannot write the run folder .*a-file/run"):
        check_writable(blocker / "run")

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the folder was checked")

    monkeypatch.setattr("starpo.models.load_model", no_loading)
    with pytest.raises(UserError, match="choose another --out"):
        Trainer(load_config("cpu-tiny-smoke", []), blocker / "run", quiet=True)


def test_too_little_free_space_for_a_checkpoint_is_one_line(tmp_path):
    from starpo.trainer.checkpoints.store import check_free_space

    check_free_space(tmp_path, 1024)  # a KiB fits anywhere
    with pytest.raises(UserError, match=r"needs about .* GiB, and the disk of .* GiB free"):
        check_free_space(tmp_path, 10**18)


def test_the_trainer_checks_room_for_a_checkpoint_before_its_first_step(
    tmp_path, monkeypatch, bigram_model, make_bandit_config
):
    from collections import namedtuple

    from starpo.trainer.checkpoints import store as checkpoint
    from starpo.trainer.loop import Trainer

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(10**6, 10**6, 1000))
    model, tokenizer = bigram_model()
    with pytest.raises(UserError, match=r"a checkpoint of this run needs about"):
        Trainer(make_bandit_config("grpo"), tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    assert not (tmp_path / "metrics.jsonl").exists()  # no step ran


def test_too_little_free_space_is_reported_before_the_model_loads(
    tmp_path, monkeypatch, tiny_model_dir
):
    from collections import namedtuple

    from starpo.config import load_config
    from starpo.trainer.checkpoints import store as checkpoint
    from starpo.trainer.loop import Trainer

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the free space was checked")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(10**6, 10**6, 1000))
    monkeypatch.setattr("starpo.models.load_model", no_loading)
    cfg = load_config("cpu-tiny-smoke", [f"model.name={tiny_model_dir}"])
    with pytest.raises(UserError, match=r"a checkpoint of this run needs about"):
        Trainer(cfg, tmp_path / "run", quiet=True)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.adv_estimator=gae"],
        ["algorithm.adv_estimator=grpo", "trainer.checkpoint_contents=weights"],
        ["model.lora.enabled=true", "model.lora.rank=4"],
    ],
)
def test_the_planned_checkpoint_size_is_the_built_trainers_estimate(
    tmp_path, tiny_model_dir, overrides
):
    """The size checked before the model loads (from its config) equals the one the built
    trainer computes from its parameters."""
    from starpo.config import load_config
    from starpo.memory.plan import planned_checkpoint_size
    from starpo.trainer.loop import Trainer

    cfg = load_config("cpu-tiny-smoke", [f"model.name={tiny_model_dir}", *overrides])
    trainer = Trainer(cfg, tmp_path / "run", quiet=True)
    assert planned_checkpoint_size(cfg) == trainer.checkpoint_estimate()
