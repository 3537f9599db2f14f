"""The multi-turn recipe (`python -m starpo.demo --env ...`) end to end on a tiny model:
every stage runs and leaves its files, the table has every row on the same seeds, and a
second call resumes (runs nothing again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from starpo.errors import UserError
from starpo.recipe import RECIPES, format_results, recipe_for, run_recipe

pytestmark = pytest.mark.slow


def test_recipe_runs_every_stage_and_resumes(tmp_path: Path, tiny_model_dir: Path, capsys):
    overrides = [
        f"model.name={tiny_model_dir}",
        "model.dtype=fp32",
        "rollout.num_groups=2",
        "rollout.group_size=2",
        "rollout.max_turns=2",
        "trainer.val_seeds=3",
        "trainer.total_steps=1",
        "trainer.save_every=1",
        "optim.mini_batch_size=2",
        "optim.micro_batch_size=2",
    ]
    results = run_recipe("sokoban", tmp_path, quick=True, overrides=overrides, eval_seeds=3)

    assert list(results["rows"]) == ["base", "SFT", "SFT + StarPO-S", "base, think"]
    for row in results["rows"].values():
        assert row["num_episodes"] == 3  # the same validation seeds for every row
        assert 0.0 <= row["success_ci95_low"] <= row["success"] <= row["success_ci95_high"]
    assert (tmp_path / "sft" / "sft_summary.json").exists()
    assert (tmp_path / "rl" / "final" / "config.json").exists()
    for folder in ("base", "base-think", "sft-eval", "rl-eval"):
        assert (tmp_path / folder / "trajectories.jsonl").exists()
    think = [json.loads(line) for line in open(tmp_path / "base-think" / "trajectories.jsonl")]
    assert all(turn["response"].startswith("<think>") for t in think for turn in t["turns"])
    assert set(results["minutes"]) == {
        "base",
        "base, think",
        "sft",
        "SFT eval",
        "StarPO-S",
        "StarPO-S eval",
    }
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"] == results["rows"]

    capsys.readouterr()
    again = run_recipe("sokoban", tmp_path, quick=True, overrides=overrides, eval_seeds=3)
    printed = capsys.readouterr().out
    assert printed.count("done before") == 6  # every stage resumed, none re-run
    assert again["rows"] == results["rows"]
    assert "StarPO-S's own contribution" in format_results(again)


def test_unknown_recipe_names_the_choices():
    with pytest.raises(UserError, match="choose one of: " + ", ".join(RECIPES)):
        recipe_for("bandit")


def test_demo_reports_a_bad_env_or_override_in_one_line(capsys):
    from starpo.demo import main

    assert main(["--env", "bandit"]) == 2
    assert main(["--env", "sokoban", "--eval-seeds", "0"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[0].startswith("starpo: error: no multi-turn recipe for env 'bandit'")
    assert errors[1] == "starpo: error: eval_seeds must be at least 1, got 0"
    assert len(errors) == 2  # no traceback
