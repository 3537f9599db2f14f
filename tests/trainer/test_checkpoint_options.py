"""Checkpoint options end to end: async writes keep runs and resumes exact; weights-only
checkpoints are a third of the size and resume with a warning; LoRA saves only adapters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from run_metrics import comparable

from starpo.runs.metrics import read_metrics
from starpo.trainer.checkpoints.store import checkpoint_bytes, latest_checkpoint, load_checkpoint
from starpo.trainer.loop import Trainer

pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs

QUIET_VAL = {"trainer.val_every": "2", "trainer.val_seeds": "8"}


def _trainer(run_dir: Path, cfg, bigram_model, *, resume=False, unfreeze=False) -> Trainer:
    model, tokenizer = bigram_model()
    if unfreeze:
        model.requires_grad_(True)
    return Trainer(cfg, run_dir, resume=resume, quiet=True, model=model, tokenizer=tokenizer)


def _assert_same_tensors(a, b) -> None:
    """Equal nested states: tensors bit for bit, everything else by ==."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same_tensors(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_tensors(x, y)
    else:
        assert a == b or (a != a and b != b)  # NaN equals NaN here


def test_async_checkpoints_log_the_same_run_and_resume_exactly(
    tmp_path: Path, bigram_model, make_bandit_config
):
    """An async run equals a synchronous one (metrics and every saved tensor), and a run
    stopped and resumed from async-written checkpoints equals the unbroken one."""
    sync_cfg = make_bandit_config("gae", total_steps=4, **QUIET_VAL, **{"trainer.save_every": "1"})
    async_cfg = make_bandit_config(
        "gae",
        total_steps=4,
        **QUIET_VAL,
        **{"trainer.save_every": "1", "trainer.checkpoint_async": "true"},
    )
    _trainer(tmp_path / "sync", sync_cfg, bigram_model).train()
    history = _trainer(tmp_path / "async", async_cfg, bigram_model).train()
    expected = comparable(read_metrics(tmp_path / "sync"))
    assert comparable(read_metrics(tmp_path / "async")) == expected
    a = load_checkpoint(latest_checkpoint(tmp_path / "sync"))
    b = load_checkpoint(latest_checkpoint(tmp_path / "async"))
    assert a["step"] == b["step"] == 4
    for key in ("actor", "critic", "actor_optim", "critic_optim", "actor_schedule", "rng"):
        _assert_same_tensors(a[key], b[key])
    # Each save's blocking seconds ride on the next step; the background write's seconds
    # and size on the first step logged after it ended.
    after_saves = [h for h in history if h["step"] > 1]
    assert all(h["perf/checkpoint_s"] >= 0 for h in after_saves)
    written = [h for h in history if "perf/checkpoint_write_s" in h]
    assert written and all(h["perf/checkpoint_mb"] > 0 for h in written)

    split = tmp_path / "split"
    _trainer(split, async_cfg, bigram_model).train(until_step=2)
    _trainer(split, async_cfg, bigram_model, resume=True).train()
    assert comparable(read_metrics(split)) == expected


def _one_step(run_dir: Path, make_bandit_config, bigram_model, contents: str, **extra):
    overrides = {
        "trainer.val_every": "0",
        "trainer.val_before_train": "false",
        "trainer.val_seeds": "4",
        "trainer.checkpoint_contents": contents,
        **extra,
    }
    cfg = make_bandit_config("grpo", total_steps=2, **overrides)
    trainer = _trainer(run_dir, cfg, bigram_model, unfreeze=True)
    trainer.train(until_step=1)
    return trainer, latest_checkpoint(run_dir)


def test_weights_only_checkpoints_are_a_third_and_resume_with_one_warning(
    tmp_path: Path, bigram_model, make_bandit_config, capsys
):
    full, full_folder = _one_step(tmp_path / "full", make_bandit_config, bigram_model, "full")
    weights, folder = _one_step(tmp_path / "weights", make_bandit_config, bigram_model, "weights")
    ratio = checkpoint_bytes(folder) / checkpoint_bytes(full_folder)
    assert 0.32 < ratio < 0.35, ratio  # fp32 weights, without AdamW's two moments
    assert weights.checkpoint_estimate() * 3 == full.checkpoint_estimate()
    for trainer, path in ((full, full_folder), (weights, folder)):
        assert 0.99 < checkpoint_bytes(path) / trainer.checkpoint_estimate() < 1.01
    state = load_checkpoint(folder)
    assert state["contents"] == "weights" and state["actor_optim"] is None
    assert state["actor_schedule"]["last_epoch"] == 1  # the schedule stays: a few bytes
    capsys.readouterr()

    resumed = _trainer(tmp_path / "weights", weights.cfg, bigram_model, resume=True)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "AdamW's moments restart" in err
    assert resumed.start_step == 1 and resumed.policy_version == 1
    assert not resumed.optimizers.actor.state  # fresh moments
    _assert_same_tensors(dict(resumed.models.actor.named_parameters()), state["actor"])
    resumed.train()
    assert [m["step"] for m in read_metrics(tmp_path / "weights")] == [1, 2]


def test_a_lora_checkpoint_holds_only_adapters_and_the_value_head(
    tmp_path: Path, bigram_model, make_bandit_config
):
    lora = {"model.lora.enabled": "true", "model.lora.rank": "4", "model.lora.alpha": "8"}
    overrides = {"trainer.val_every": "0", "trainer.val_before_train": "false"}
    for name, extra in (("lora", lora), ("all-weights", {})):
        cfg = make_bandit_config("gae", total_steps=1, **overrides, **extra)
        _trainer(tmp_path / name, cfg, bigram_model, unfreeze=True).train()
    lora_folder = latest_checkpoint(tmp_path / "lora")
    state = load_checkpoint(lora_folder)
    assert state["actor"] and all("lora_" in key for key in state["actor"])
    assert all("lora_" in key or "value_head" in key for key in state["critic"])
    assert any("value_head" in key for key in state["critic"])
    full_bytes = checkpoint_bytes(latest_checkpoint(tmp_path / "all-weights"))
    assert checkpoint_bytes(lora_folder) < full_bytes / 20


def test_a_failed_background_write_stops_the_run_with_one_line(
    tmp_path: Path, bigram_model, make_bandit_config, monkeypatch
):
    from starpo.errors import UserError
    from starpo.trainer.checkpoints import saver

    real_save = saver.save_checkpoint

    def full_disk_at_step_2(run_dir, step, state, keep, keep_every=0):
        if step == 2:
            raise OSError(28, "No space left on device")
        return real_save(run_dir, step, state, keep, keep_every)

    monkeypatch.setattr(saver, "save_checkpoint", full_disk_at_step_2)
    overrides = {
        "trainer.val_every": "0",
        "trainer.val_before_train": "false",
        "trainer.save_every": "1",
        "trainer.checkpoint_async": "true",
    }
    cfg = make_bandit_config("grpo", total_steps=4, **overrides)
    with pytest.raises(UserError, match=r"step_000002 was not written \(\[Errno 28\]") as raised:
        _trainer(tmp_path, cfg, bigram_model).train()
    assert "\n" not in str(raised.value)
    assert latest_checkpoint(tmp_path).name == "step_000001"  # what --resume continues from
    assert not (tmp_path / "final").exists()
