"""The collapse detector on real tiny-model runs: quiet on a healthy run, fires on a run
pushed into collapse (all weights, learning rate 0.05), and acts on `trainer.on_collapse`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starpo.trainer.loop import Trainer

pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs


def _run(
    tmp_path: Path,
    bigram_model,
    make_bandit_config,
    *,
    lr: str,
    unfreeze: bool,
    on_collapse: str = "warn",
    steps: int = 14,
):
    model, tokenizer = bigram_model()
    if unfreeze:
        model.requires_grad_(True)  # one-hot embeddings blur at this lr: the policy breaks
    cfg = make_bandit_config(
        "grpo",
        total_steps=steps,
        **{
            "optim.actor_lr": lr,
            "trainer.val_every": "0",
            "trainer.val_before_train": "false",
            "trainer.val_seeds": "4",
            "trainer.on_collapse": on_collapse,
        },
    )
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    return trainer, trainer.train()


def _alerts(run_dir: Path) -> list[dict]:
    path = run_dir / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_healthy_run_stays_quiet(tmp_path, bigram_model, make_bandit_config):
    _, history = _run(tmp_path, bigram_model, make_bandit_config, lr="0.01", unfreeze=False)
    assert [h["diagnostics/state"] for h in history] == [0.0] * 14
    assert history[-1]["train/bandit/success"] > history[0]["train/bandit/success"]
    assert _alerts(tmp_path) == []
    assert "diagnostics/distinct_2" in history[-1] and "rollout/in_group_std" in history[-1]


def test_collapsing_run_fires_and_warn_keeps_going(tmp_path, bigram_model, make_bandit_config):
    _, history = _run(tmp_path, bigram_model, make_bandit_config, lr="0.05", unfreeze=True)
    assert len(history) == 14  # on_collapse=warn only warns
    states = [h["diagnostics/state"] for h in history]
    assert 2.0 in states and states[-1] == 2.0
    assert history[-1]["train/bandit/format_ok"] < 0.1  # the policy really broke
    alerts = _alerts(tmp_path)
    assert any(a["severity"] == "collapse" for a in alerts)
    assert {"step", "rule", "message", "state"} <= set(alerts[0])


def test_on_collapse_stop(tmp_path, bigram_model, make_bandit_config):
    _, history = _run(
        tmp_path, bigram_model, make_bandit_config, lr="0.05", unfreeze=True, on_collapse="stop"
    )
    assert len(history) < 14 and history[-1]["diagnostics/state"] == 2.0
    last_step = history[-1]["step"]
    assert (tmp_path / "checkpoints" / f"step_{last_step:06d}").is_dir()


@pytest.mark.parametrize("checkpoint_async", ["false", "true"], ids=["sync", "async"])
def test_on_collapse_rollback(tmp_path, bigram_model, make_bandit_config, checkpoint_async):
    """With async checkpoints the rollback waits for the healthy/ copy in flight."""
    model, tokenizer = bigram_model()
    model.requires_grad_(True)
    overrides = {
        "optim.actor_lr": "0.05",
        "trainer.val_every": "0",
        "trainer.val_before_train": "false",
        "trainer.val_seeds": "4",
        "trainer.on_collapse": "rollback",
        "trainer.save_every": "2",
        "trainer.checkpoint_async": checkpoint_async,
    }
    cfg = make_bandit_config("grpo", total_steps=14, **overrides)
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    history = trainer.train()
    assert trainer.rollbacks >= 1
    assert history[-1]["diagnostics/rollbacks"] >= 1
    assert trainer.optimizers.actor.param_groups[0]["lr"] <= 0.025  # halved at least once
    assert trainer.cfg.filter.enabled
    assert (tmp_path / "healthy" / "checkpoints").is_dir()

    # Killed after its last checkpoint and resumed from the user's config: the rollback's
    # changes (filter on, halved learning rates) come back from the checkpoint.
    fresh_cfg = make_bandit_config("grpo", total_steps=14, **overrides)
    assert not fresh_cfg.filter.enabled
    model, tokenizer = bigram_model()
    model.requires_grad_(True)
    resumed = Trainer(
        fresh_cfg, tmp_path, resume=True, quiet=True, model=model, tokenizer=tokenizer
    )
    assert resumed.start_step == 14 and resumed.rollbacks == trainer.rollbacks
    assert (resumed.cfg.filter.enabled, resumed.cfg.filter.ratio) == (True, 0.5)
    lr = trainer.optimizers.actor.param_groups[0]["lr"]
    assert resumed.optimizers.actor.param_groups[0]["lr"] == lr
    assert resumed.optimizers.actor_schedule.base_lrs == trainer.optimizers.actor_schedule.base_lrs
