"""Learning-rate schedules (values, logging, checkpoint and resume) and non-finite updates."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from starpo.compute.lr_schedule import lr_multiplier
from starpo.errors import UserError
from starpo.runs.metrics import read_metrics
from starpo.trainer import prepare
from starpo.trainer.checkpoints.store import latest_checkpoint, load_checkpoint
from starpo.trainer.loop import Trainer


def test_warmup_then_constant():
    got = [lr_multiplier(k, warmup=4, total=10) for k in range(6)]
    assert got == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_warmup_then_cosine_to_the_floor():
    kw = {"warmup": 2, "total": 12, "schedule": "cosine", "min_ratio": 0.1}
    assert lr_multiplier(0, **kw) == 0.5 and lr_multiplier(1, **kw) == 1.0
    assert lr_multiplier(2, **kw) == pytest.approx(1.0)  # cosine starts at the top
    assert lr_multiplier(7, **kw) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway
    assert lr_multiplier(12, **kw) == pytest.approx(0.1)
    assert lr_multiplier(50, **kw) == pytest.approx(0.1)  # past the end: stays at the floor
    values = [lr_multiplier(k, **kw) for k in range(2, 13)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_no_warmup_starts_at_full_rate():
    assert lr_multiplier(0, warmup=0, total=5) == 1.0
    with pytest.raises(ValueError, match="linear"):
        lr_multiplier(0, warmup=0, total=5, schedule="linear")


SCHEDULE = {
    "optim.lr_warmup_steps": "2",
    "optim.lr_schedule": "cosine",
    "optim.min_lr_ratio": "0.2",
    "trainer.val_every": "0",
    "trainer.val_before_train": "false",
    "trainer.val_seeds": "4",
}


@pytest.mark.slow
def test_schedule_is_logged_and_resume_continues_it(
    tmp_path: Path, bigram_model, make_bandit_config
):
    cfg = make_bandit_config("grpo", total_steps=4, **SCHEDULE)
    straight = tmp_path / "straight"
    model, tokenizer = bigram_model()
    Trainer(cfg, straight, quiet=True, model=model, tokenizer=tokenizer).train()
    lrs = [row["actor/lr"] for row in read_metrics(straight)]
    # One update per step (16 trajectories, mini-batch 16); actor/lr is the next update's.
    expected = [
        0.05 * lr_multiplier(k, warmup=2, total=4, schedule="cosine", min_ratio=0.2)
        for k in range(1, 5)
    ]
    assert lrs == pytest.approx(expected)

    split = tmp_path / "split"
    model, tokenizer = bigram_model()
    Trainer(cfg, split, quiet=True, model=model, tokenizer=tokenizer).train(until_step=2)
    state = load_checkpoint(latest_checkpoint(split))
    assert state["actor_schedule"]["last_epoch"] == 2
    model, tokenizer = bigram_model()
    Trainer(cfg, split, resume=True, quiet=True, model=model, tokenizer=tokenizer).train()
    assert [row["actor/lr"] for row in read_metrics(split)] == pytest.approx(lrs)


# ------------------------------------------------------------------ non-finite


def _poison_steps(monkeypatch, steps: set[int]) -> None:
    """NaN advantages at the given training steps (an injected numerical fault); the
    advantages are computed once per step."""
    real, calls = prepare.compute_advantages, []

    def poisoned(*args, **kwargs):
        advantages, returns = real(*args, **kwargs)
        calls.append(1)
        if len(calls) in steps:
            advantages = advantages + float("nan")
        return advantages, returns

    monkeypatch.setattr(prepare, "compute_advantages", poisoned)


def _spy_on_steps(trainer: Trainer) -> dict[int, tuple]:
    """Record (weights, Adam moments, schedule position) before and after every step."""
    seen: dict[int, tuple] = {}
    real = trainer.train_step

    def state() -> tuple:
        moments = trainer.optimizers.actor.state_dict()["state"]
        return (
            trainer.models.actor.lm_head.weight.detach().clone(),
            moments[0]["exp_avg"].clone() if moments else None,
            trainer.optimizers.actor_schedule.last_epoch,
        )

    def spy(step: int):
        before = state()
        out = real(step)
        seen[step] = (before, state())
        return out

    trainer.train_step = spy
    return seen


@pytest.mark.slow
def test_non_finite_update_is_skipped_and_reported(
    tmp_path: Path, monkeypatch, bigram_model, make_bandit_config
):
    cfg = make_bandit_config("grpo", total_steps=3, **SCHEDULE)
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    _poison_steps(monkeypatch, {2})
    seen = _spy_on_steps(trainer)
    rows = trainer.train()
    assert [row["actor/skipped_steps"] for row in rows] == [0.0, 1.0, 0.0]
    (w0, m0, e0), (w1, m1, e1) = seen[2]
    assert torch.equal(w0, w1) and torch.equal(m0, m1) and e0 == e1  # step 2 untouched
    (w0, _, e0), (w1, _, e1) = seen[3]
    assert not torch.equal(w0, w1) and e1 == e0 + 1  # the next clean step trains again
    poisoned = ("actor/advantage_mean", "actor/advantage_aggregated")
    assert all(math.isnan(rows[1][key]) for key in poisoned)  # the fault shows in the log ...
    finite = [v for row in rows for k, v in row.items() if k not in poisoned]
    assert all(math.isfinite(v) for v in finite if isinstance(v, float))  # ... nothing else
    alerts = trainer.alerts.read()
    assert [(a["step"], a["rule"]) for a in alerts] == [(2, "non_finite_update")]
    assert trainer.skips.consecutive == 0


@pytest.mark.slow
def test_consecutive_non_finite_updates_stop_the_run(
    tmp_path: Path, monkeypatch, bigram_model, make_bandit_config
):
    extra = {**SCHEDULE, "optim.max_skipped_updates": "2"}
    cfg = make_bandit_config("grpo", total_steps=6, **extra)
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    _poison_steps(monkeypatch, {2, 3, 4, 5, 6})
    with pytest.raises(UserError, match="2 consecutive updates had a non-finite"):
        trainer.train()
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2]  # step 3 never logged
