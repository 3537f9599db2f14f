"""End-to-end training on a tiny model: reward rises, parameters change, resume is exact."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from run_metrics import comparable

from starpo.runs.metrics import read_metrics
from starpo.trainer.loop import Trainer

pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs


@pytest.mark.parametrize("adv_estimator", ["grpo", "gae"])
def test_training_raises_reward_and_changes_parameters(
    tmp_path: Path, adv_estimator: str, bigram_model, make_bandit_config
):
    model, tokenizer = bigram_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = make_bandit_config(adv_estimator)
    history = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer).train()
    val = [h["val/bandit/success"] for h in history if "val/bandit/success" in h]
    train = [h["train/bandit/success"] for h in history if "train/bandit/success" in h]
    assert len(val) == 3  # steps 0, 3 and 6
    assert val[-1] > val[0] + 0.25, val
    assert sum(train[-2:]) / 2 > sum(train[:2]) / 2, train
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert "lm_head.weight" in changed
    metrics = history[-1]
    for key in (
        "actor/entropy",
        "actor/grad_norm",
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/approx_kl",
        "rollout/in_group_std",
        "rollout/kept_in_group_std",
        "train/bandit/mean_response_tokens",
        "timing_s/rollout",
        "timing_s/update",
        "perf/tokens_per_s",
        "perf/update_flops",
        "perf/update_gflops",
        "perf/update_peak_share",
        "perf/matmul_peak_gflops",
        "train/bandit/success",
    ):
        assert key in metrics, key
    assert metrics["perf/update_peak_share"] == pytest.approx(
        metrics["perf/update_gflops"] / metrics["perf/matmul_peak_gflops"]
    )
    if adv_estimator == "gae":
        assert "critic/vf_loss" in metrics and "critic/explained_var" in metrics
    assert (tmp_path / "final" / "config.json").is_file()
    assert (tmp_path / "metrics.jsonl").is_file() and (tmp_path / "config.yaml").is_file()
    assert [m["step"] for m in read_metrics(tmp_path)] == [0, 1, 2, 3, 4, 5, 6]
    # Saves at steps 2, 4 and 6 (save_every=2); each one's cost rides on the next step's line.
    saved = [h for h in history if "perf/checkpoint_mb" in h]
    assert [h["step"] for h in saved] == [3, 5]
    on_disk = sum(p.stat().st_size for p in (tmp_path / "checkpoints").rglob("*") if p.is_file())
    assert all(0 < h["perf/checkpoint_mb"] * 2**20 <= on_disk for h in saved)
    assert all(h["perf/checkpoint_s"] >= 0 for h in saved)


@pytest.mark.parametrize("adv_estimator", ["grpo", "gae"])
def test_resume_logs_the_same_metrics_as_an_uninterrupted_run(
    tmp_path: Path, adv_estimator, bigram_model, make_bandit_config
):
    cfg = make_bandit_config(
        adv_estimator, total_steps=4, **{"trainer.val_every": "2", "trainer.val_seeds": "8"}
    )
    straight = tmp_path / "straight"
    model, tokenizer = bigram_model()
    Trainer(cfg, straight, quiet=True, model=model, tokenizer=tokenizer).train()

    split = tmp_path / "split"
    model, tokenizer = bigram_model()
    Trainer(cfg, split, quiet=True, model=model, tokenizer=tokenizer).train(until_step=2)
    assert [m["step"] for m in read_metrics(split)] == [0, 1, 2]
    model, tokenizer = bigram_model()  # a fresh process would rebuild the initial model
    Trainer(cfg, split, resume=True, quiet=True, model=model, tokenizer=tokenizer).train()

    assert comparable(read_metrics(split)) == comparable(read_metrics(straight))
    final_a = json.loads((straight / "final" / "config.json").read_text())
    assert final_a == json.loads((split / "final" / "config.json").read_text())


def test_step_line_shows_the_policy_entropy(
    tmp_path: Path, bigram_model, make_bandit_config, capsys
):
    """The console line reads actor/entropy, not a same-named diagnostics flag, and ends
    with the time the run likely still needs while steps remain."""
    cfg = make_bandit_config("grpo", total_steps=2, **{"trainer.val_before_train": "false"})
    model, tokenizer = bigram_model()
    row, _ = Trainer(cfg, tmp_path, model=model, tokenizer=tokenizer).train()
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("step ")]
    line = next(x for x in lines if x.startswith("step 1/2"))
    assert row["actor/entropy"] > 0.05  # the bigram policy is not deterministic yet
    assert f"| entropy {row['actor/entropy']:.2f} |" in line
    assert re.search(r" \| left ~[0-9.]+ (s|min|h)$", line)  # one step left, at step 1's pace
    assert "left" not in next(x for x in lines if x.startswith("step 2/2"))
