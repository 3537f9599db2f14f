"""The multi-turn recipe (`starpo demo --env ...`) end to end on a tiny model:
every stage runs and leaves its files, the table has every row on the same seeds, and a
second call resumes (runs nothing again). With the heavy stages stubbed: the recipe's
flags reach the stages and the table, and a resumed folder made with other settings is
refused."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch

from starpo.config import load_config
from starpo.errors import UserError
from starpo.recipe import stages as recipe_module
from starpo.recipe.methods import RECIPES, RecipeChoices, recipe_for
from starpo.recipe.results import format_results
from starpo.recipe.stages import BUDGETED_STEPS, check_kept_settings, run_recipe


@pytest.mark.slow
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
    results = run_recipe(
        "sokoban", tmp_path, RecipeChoices(eval_seeds=3), quick=True, overrides=overrides
    )

    assert list(results["rows"]) == ["base", "SFT", "SFT + GRPO", "base, think"]
    for row in results["rows"].values():
        assert row["num_episodes"] == 3  # the same validation seeds for every row
        assert 0.0 <= row["success_ci95_low"] <= row["success"] <= row["success_ci95_high"]
    assert (tmp_path / "sft" / "sft_summary.json").exists()
    assert (tmp_path / "rl-grpo" / "final" / "config.json").exists()
    for folder in ("base", "base-think", "sft-eval", "rl-grpo-eval"):
        assert (tmp_path / folder / "trajectories.jsonl").exists()
    think = [json.loads(line) for line in open(tmp_path / "base-think" / "trajectories.jsonl")]
    assert all(turn["response"].startswith("<think>") for t in think for turn in t["turns"])
    assert set(results["minutes"]) == {
        "base",
        "base, think",
        "sft",
        "SFT eval",
        "RL grpo",
        "RL grpo eval",
    }
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["rows"] == results["rows"]
    # the table names the machine it was measured on: cores, CPU capability, bf16, date
    capability = torch.backends.cpu.get_cpu_capability()
    assert f"torch capability {capability}" in saved["machine"]
    assert saved["date"] == datetime.datetime.now(datetime.UTC).date().isoformat()
    assert saved["machine"] in format_results(saved).splitlines()[0]

    capsys.readouterr()
    again = run_recipe(
        "sokoban", tmp_path, RecipeChoices(eval_seeds=3), quick=True, overrides=overrides
    )
    printed = capsys.readouterr().out
    assert printed.count("done before") == 6  # every stage resumed, none re-run
    assert again["rows"] == results["rows"]
    assert "GRPO's own contribution" in format_results(again)


def main(argv: list[str]) -> int:
    """`starpo demo ARGV` (the recipe's command) in this process; its exit code."""
    from starpo.cli import main as starpo_main

    try:
        return starpo_main(["demo", *argv])
    except SystemExit as exc:  # a flag argparse refuses
        return int(exc.code or 0)


def test_unknown_recipe_names_the_choices():
    with pytest.raises(UserError, match="choose one of: " + ", ".join(RECIPES)):
        recipe_for("bandit")


def test_demo_reports_a_bad_env_or_override_in_one_line(capsys):

    assert main(["--env", "bandit"]) == 2
    assert main(["--env", "sokoban", "--eval-seeds", "0"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[0].startswith("starpo: error: no multi-turn recipe for env 'bandit'")
    assert errors[1] == "starpo: error: --eval-seeds must be at least 1, got 0"
    assert len(errors) == 2  # no traceback


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--sft-episodes", "0"], "--sft-episodes must be at least 1, got 0"),
        (["--sft-epochs", "-2"], "--sft-epochs must be at least 1, got -2"),
        (["--sft-epochs", "two"], "argument --sft-epochs: invalid int value: 'two'"),
        (["--rl-minutes", "0"], "--rl-minutes must be a number of minutes above 0, got 0"),
        (["--rl-minutes", "nan"], "--rl-minutes must be a number of minutes above 0, got nan"),
        (["--rl-minutes", "inf"], "--rl-minutes must be a number of minutes above 0, got inf"),
        (["--rl-minutes", "soon"], "argument --rl-minutes: invalid float value: 'soon'"),
    ],
)
def test_demo_refuses_bad_recipe_flags_in_one_line(tmp_path, capsys, flags, error):

    assert main(["--env", "sokoban", "--out", str(tmp_path / "r"), *flags]) == 2
    assert capsys.readouterr().err.splitlines() == [f"starpo: error: {error}"]
    assert not (tmp_path / "r").exists()  # before any work


def test_recipe_flags_need_the_recipe(capsys):

    assert main(["--rl-minutes", "5"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("starpo: error: --rl-minutes sets the multi-turn recipe's stages")


# ------------------------------------------------------------- with stubbed stages
ROW = {"success": 0.5, "success_ci95_low": 0.4, "success_ci95_high": 0.6, "format_ok": 1.0}


@pytest.fixture
def stubbed(monkeypatch):
    """Evaluations, SFT and the trainer stubbed; what each was asked is kept in `calls`."""
    calls: dict[str, list] = {"evaluate": [], "sft": [], "train": [], "env_kwargs": []}

    def evaluate(model, cfg, folder, settings, seeds, env_kwargs):
        calls["evaluate"].append(folder.name)
        calls["env_kwargs"].append(env_kwargs)
        return {"model": model, **ROW, "num_episodes": seeds}

    def train_sft(recipe, cfg, sft_dir):
        calls["sft"].append((recipe.sft_episodes, recipe.sft_epochs, recipe.sft_lr))
        sft_dir.mkdir(parents=True)
        return {"epochs": [], "data": {}}

    class Trainer:
        def __init__(self, cfg, run_dir, resume=False):
            calls["train"].append(cfg.trainer)
            self.run_dir = run_dir

        def train(self):
            rows = [{"step": s, "perf/train_minutes": 10.25 * s} for s in (1, 2, 3)]
            self.run_dir.mkdir(parents=True)
            text = "".join(json.dumps(r) + "\n" for r in rows)
            (self.run_dir / "metrics.jsonl").write_text(text)
            return rows

    monkeypatch.setattr(recipe_module, "evaluate", evaluate)
    monkeypatch.setattr(recipe_module, "train_sft", train_sft)
    monkeypatch.setattr("starpo.trainer.Trainer", Trainer)
    return calls


def test_recipe_flags_reach_the_stages_and_label_the_rows(tmp_path, stubbed, capsys):

    flags = ["--sft-episodes", "400", "--sft-epochs", "5", "--rl-minutes", "30"]
    assert main(["--env", "sokoban", "--out", str(tmp_path), "--eval-seeds", "3", *flags]) == 0
    assert stubbed["sft"] == [(400, 5, 2e-4)]
    (trainer,) = stubbed["train"]
    assert trainer.max_minutes == 30.0 and trainer.total_steps == BUDGETED_STEPS
    results = json.loads((tmp_path / "results.json").read_text())
    labels = [row.get("label", name) for name, row in results["rows"].items()]
    assert labels == [
        "base",
        "SFT (400 solver episodes, 5 epochs, lr 2e-4)",
        "SFT + GRPO (3 steps, 30.8 of 30 min)",
        "base, think",
    ]
    settings = results["settings"]
    preset = load_config("cpu-sokoban-sft-starpo-s")  # what the SFT examples were made with
    assert settings.pop("layout") == json.loads(json.dumps(preset.rollout.settings().layout()))
    assert settings.pop("env_kwargs") == json.loads(json.dumps(dict(preset.env.kwargs)))
    assert settings.pop("base_model") == preset.model.name
    assert settings == {
        "sft_episodes": 400,
        "sft_epochs": 5,
        "sft_lr": 2e-4,
        "rl_minutes": 30.0,
        "methods": ["grpo"],
    }
    assert results["rl_runs"] == {"grpo": {"steps": 3, "train_minutes": 30.75}}
    table = capsys.readouterr().out
    assert all(label in table for label in labels)


def test_steps_still_cap_a_budgeted_rl_stage(tmp_path, stubbed):

    argv = ["--env", "sokoban", "--out", str(tmp_path), "--rl-minutes", "2.5", "--steps", "7"]
    assert main([*argv, "--quick"]) == 0
    (trainer,) = stubbed["train"]
    assert (trainer.max_minutes, trainer.total_steps) == (2.5, 7)
    assert stubbed["sft"] == [(16, 1, 2e-4)]  # --quick's SFT
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert rows["SFT + GRPO"]["label"] == "SFT + GRPO (3 steps, 30.8 of 2.5 min)"


def test_a_resumed_recipe_made_with_other_sft_settings_is_refused(tmp_path, stubbed, capsys):

    run_recipe("sokoban", tmp_path, RecipeChoices(eval_seeds=3))
    done = {key: list(calls) for key, calls in stubbed.items()}
    assert main(["--env", "sokoban", "--out", str(tmp_path), "--sft-episodes", "400"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"starpo: error: {tmp_path / 'sft'} was made with --sft-episodes 200, not "
        "--sft-episodes 400: pass the same settings to resume, choose another --out, or "
        f"delete sft, sft-eval, rl-grpo, rl-grpo-eval in {tmp_path} to redo them"
    )
    assert stubbed == done  # refused before any stage ran
    # The same settings resume: every stage is kept, none runs again.
    again = run_recipe("sokoban", tmp_path, RecipeChoices(eval_seeds=3, sft_episodes=200))
    assert stubbed == done and capsys.readouterr().out.count("done before") == 6
    assert again["rows"]["SFT"]["label"] == "SFT (200 solver episodes, 3 epochs, lr 2e-4)"


def test_a_format_only_warm_start_labels_its_rows_and_is_not_resumed_as_solver_sft(
    tmp_path, stubbed, capsys, monkeypatch
):

    sources = []
    stub = recipe_module.train_sft
    monkeypatch.setattr(
        recipe_module, "train_sft", lambda r, c, d: sources.append(r.sft_from) or stub(r, c, d)
    )
    argv = ["--env", "frozenlake", "--out", str(tmp_path), "--eval-seeds", "3", "--no-base"]
    assert main([*argv, "--sft-from", "random", "--sft-episodes", "256"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert sources == ["random"] and results["settings"]["sft_from"] == "random"
    label = results["rows"]["SFT"]["label"]
    assert label == "SFT (256 random-policy episodes: format only, 3 epochs, lr 2e-4)"
    capsys.readouterr()
    assert main([*argv, "--sft-episodes", "256"]) == 2  # the solver's SFT is another start
    (line,) = capsys.readouterr().err.splitlines()
    assert "was made with --sft-from random, not --sft-from solver" in line


def test_a_weak_warm_start_records_its_skill_and_a_stray_skill_is_refused(
    tmp_path, stubbed, capsys, monkeypatch
):
    skills = []
    stub = recipe_module.train_sft
    monkeypatch.setattr(
        recipe_module,
        "train_sft",
        lambda r, c, d: skills.append((r.sft_from, r.weak_skill)) or stub(r, c, d),
    )
    argv = ["--env", "frozenlake", "--out", str(tmp_path), "--eval-seeds", "3", "--no-base"]
    assert main([*argv, "--sft-from", "weak", "--weak-skill", "0.25"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert skills == [("weak", 0.25)]
    assert results["settings"]["weak_skill"] == 0.25
    label = results["rows"]["SFT"]["label"]
    assert label == "SFT (200 weak-policy episodes: 25% solver moves, 3 epochs, lr 2e-4)"
    capsys.readouterr()
    assert main([*argv, "--sft-from", "weak", "--weak-skill", "0.5"]) == 2  # another start
    (line,) = capsys.readouterr().err.splitlines()
    assert "was made with --weak-skill 0.25, not --weak-skill 0.5" in line
    for stray in (["--weak-skill", "0.5"], ["--sft-from", "weak", "--weak-skill", "1.5"]):
        assert main([*argv, *stray]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("starpo: error: --") and "weak" in line


def test_a_finished_rl_stage_with_a_smaller_budget_is_refused(tmp_path, stubbed):
    run_recipe("sokoban", tmp_path, RecipeChoices(eval_seeds=3, rl_minutes=20))
    with pytest.raises(UserError) as info:
        run_recipe("sokoban", tmp_path, RecipeChoices(eval_seeds=3, rl_minutes=10))
    assert str(info.value).startswith(
        f"{tmp_path / 'rl-grpo'} was made with --rl-minutes 20, not --rl-minutes 10: "
    )
    assert str(info.value).endswith(f"delete rl-grpo, rl-grpo-eval in {tmp_path} to redo them")


@pytest.fixture
def checkpointing(stubbed, monkeypatch):
    """The stubbed recipe with a trainer that trains to total_steps, continuing a run's
    metrics when resumed, and a checkpoint wherever a run has metrics; `resumed` lists
    each run's resume flag."""
    resumed: list[bool] = []

    class Trainer:
        def __init__(self, cfg, run_dir, resume=False):
            self.cfg, self.run_dir = cfg, run_dir
            resumed.append(resume)

        def train(self):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            steps = range(1, self.cfg.trainer.total_steps + 1)
            rows = [{"step": s, "perf/train_minutes": float(s)} for s in steps]
            text = "".join(json.dumps(r) + "\n" for r in rows)
            (self.run_dir / "metrics.jsonl").write_text(text)

    def latest_checkpoint(run_dir):
        return run_dir / "checkpoints" if (run_dir / "metrics.jsonl").exists() else None

    monkeypatch.setattr("starpo.trainer.Trainer", Trainer)
    monkeypatch.setattr("starpo.trainer.checkpoints.store.latest_checkpoint", latest_checkpoint)
    return resumed


RL_ONLY = ["--env", "frozenlake", "--eval-seeds", "3", "--no-base", "--methods", "grpo"]


def test_more_rl_steps_continue_the_finished_run(tmp_path, stubbed, checkpointing, capsys):
    """A finished recipe asked for more RL steps (its learning rate constant) continues
    its RL run from the checkpoint and evaluates it again; the earlier record and
    evaluation are kept, moved aside. The SFT stage is not redone; fewer steps are refused."""
    argv = [*RL_ONLY, "--out", str(tmp_path)]
    assert main([*argv, "--steps", "3"]) == 0
    capsys.readouterr()
    assert main([*argv, "--steps", "5"]) == 0
    assert checkpointing == [False, True]
    assert stubbed["sft"] == [(200, 3, 2e-4)]
    assert stubbed["evaluate"] == ["sft-eval", "rl-grpo-eval", "rl-grpo-eval"]
    said = capsys.readouterr().out
    assert "[RL grpo] made with 3 steps: continuing from its checkpoint" in said
    earlier = json.loads((tmp_path / "rl-grpo" / "recipe" / "stage-step3.json").read_text())
    assert earlier["steps"] == 3 and (tmp_path / "rl-grpo-eval-step3" / "stage.json").exists()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["rl_runs"]["grpo"]["steps"] == 5
    assert main([*argv, "--steps", "5"]) == 0  # done: nothing runs again
    assert checkpointing == [False, True]
    assert main([*argv, "--steps", "4"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "was made with trainer.total_steps 5, not trainer.total_steps 4" in line


@pytest.mark.parametrize(
    ("then", "named"),
    [
        (["optim.actor_lr=3e-5"], "optim.actor_lr=2e-05, not optim.actor_lr=3e-05"),
        (["rollout.num_groups=16"], "rollout.num_groups=8, not rollout.num_groups=16"),
        (["filter.enabled=true"], "filter.enabled=false, not filter.enabled=true"),
    ],
)
def test_a_finished_rl_stage_is_not_reused_for_other_rl_settings(
    tmp_path, stubbed, capsys, then, named
):
    """An RL stage records the settings that shape what it learns, so resuming its folder
    with another learning rate, batch or filter is refused, not answered with the old run;
    the micro-batch size and threads only change speed and may differ."""
    argv = [*RL_ONLY, "--out", str(tmp_path), "optim.actor_lr=2e-5", "filter.enabled=false"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, *then]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"{tmp_path / 'rl-grpo'} was made with {named}" in line
    assert main([*argv, "optim.micro_batch_size=1", "trainer.num_threads=1"]) == 0
    assert len(stubbed["train"]) == 1  # trained once


def test_an_rl_stage_recorded_before_its_rl_settings_were_is_taken_as_it_is(tmp_path, stubbed):
    argv = [*RL_ONLY, "--out", str(tmp_path)]
    assert main(argv) == 0
    for record in (tmp_path / "rl-grpo" / "recipe", tmp_path / "rl-grpo-eval"):
        kept = json.loads((record / "stage.json").read_text())
        kept["settings"] = {k: v for k, v in kept["settings"].items() if "." not in k}
        (record / "stage.json").write_text(json.dumps(kept))
    assert main([*argv, "optim.actor_lr=3e-5"]) == 0  # nothing to compare it with
    assert len(stubbed["train"]) == 1


def test_a_longer_cosine_run_is_not_the_shorter_one_continued(tmp_path, stubbed, checkpointing):
    """A cosine schedule decays over total_steps: more steps keep the finished stage's
    refusal instead of continuing it, and nothing is moved."""
    argv = [*RL_ONLY, "--out", str(tmp_path), "optim.lr_schedule=cosine"]
    assert main([*argv, "--steps", "3"]) == 0
    assert main([*argv, "--steps", "5"]) == 2
    assert checkpointing == [False]
    assert (tmp_path / "rl-grpo" / "recipe" / "stage.json").exists()
    assert not (tmp_path / "rl-grpo-eval-step3").exists()


def test_stages_that_recorded_no_settings_are_taken_as_they_are(tmp_path):
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "stage.json").write_text(json.dumps({"stage": "sft", "minutes": 1.0}))
    (tmp_path / "sft-eval").mkdir()
    (tmp_path / "sft-eval" / "stage.json").write_text("{torn")
    wanted = {"sft_episodes": 400, "sft_epochs": 5, "sft_lr": 2e-4}
    check_kept_settings(tmp_path, {"sft": wanted, "sft-eval": wanted})  # no error


@pytest.mark.parametrize(
    "first, then, named",
    [
        (["rollout.format_every_turn=false"], [], "rollout settings"),
        (["env.kwargs={is_slippery: false}"], [], "env.kwargs {is_slippery: false}"),
    ],
)
def test_an_sft_model_laid_out_or_played_otherwise_is_not_reused(
    tmp_path, stubbed, capsys, first, then, named
):
    # Was reused: the stage recorded its episodes, epochs and rate, not the layout of its
    # examples or the env they were played on.
    argv = ["--env", "frozenlake", "--out", str(tmp_path), "--eval-seeds", "3", "--no-base"]
    assert main([*argv, *first]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["settings"]["layout"]["max_turns"] >= 1
    assert main([*argv, *then]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"sft was made with {named}" in line and "delete sft, sft-eval" in line
    assert stubbed["sft"] == [(200, 3, 2e-4)]  # not trained again
    assert main([*argv, *first]) == 0  # the same settings resume


def test_a_stage_recorded_before_the_layout_was_is_taken_as_it_is(tmp_path):
    before = {"sft_episodes": 200, "sft_epochs": 3, "sft_lr": 2e-4}
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "stage.json").write_text(json.dumps({"minutes": 1, "settings": before}))
    wanted = {**before, "base_model": "m", "env_kwargs": {}, "layout": {"max_turns": 5}}
    check_kept_settings(tmp_path, {"sft": wanted})  # no error
    with pytest.raises(UserError, match="made with --sft-epochs 3, not --sft-epochs 2"):
        check_kept_settings(tmp_path, {"sft": {**wanted, "sft_epochs": 2}})


def test_methods_train_from_the_same_sft_model_with_the_same_budget(tmp_path, stubbed, capsys):

    argv = ["--env", "sokoban", "--out", str(tmp_path), "--eval-seeds", "3", "--no-base"]
    assert main([*argv, "--rl-minutes", "20", "--methods", "grpo", "gigpo", "ppo"]) == 0
    trainers = stubbed["train"]
    assert [t.max_minutes for t in trainers] == [20.0] * 3
    assert stubbed["sft"] == [(200, 3, 2e-4)]  # one SFT model for all three
    assert stubbed["evaluate"] == ["sft-eval", "rl-grpo-eval", "rl-gigpo-eval", "rl-ppo-eval"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results["rows"]) == ["SFT", "SFT + GRPO", "SFT + GiGPO", "SFT + PPO"]
    assert results["settings"]["methods"] == ["grpo", "gigpo", "ppo"]
    assert results["overrides"] == []
    table = capsys.readouterr().out
    for label in ("GRPO", "GiGPO", "PPO"):
        assert f"{label}'s own contribution: +0.0% (the 95% intervals overlap)" in table


def test_an_override_after_the_methods_stays_an_override(tmp_path, stubbed):
    """`--methods` takes a list, so it would swallow the dotted override written next."""
    argv = ["--env", "sokoban", "--out", str(tmp_path), "--eval-seeds", "3", "--no-base"]
    assert (
        main([*argv, "--methods", "grpo,ppo", "trainer.total_steps=7", "filter.enabled=false"]) == 0
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["settings"]["methods"] == ["grpo", "ppo"]
    assert results["overrides"] == ["trainer.total_steps=7", "filter.enabled=false"]
    assert [t.total_steps for t in stubbed["train"]] == [7, 7]


def test_each_method_sets_its_estimator_and_keeps_the_preset(tmp_path, stubbed, monkeypatch):
    seen = []
    monkeypatch.setattr(
        recipe_module, "train_rl", lambda cfg, rl_dir: seen.append(cfg) or {"steps": 1}
    )
    run_recipe(
        "sokoban", tmp_path, RecipeChoices(eval_seeds=3), methods=["ppo", "gigpo"], base_rows=False
    )
    ppo, gigpo = seen
    assert (ppo.algorithm.adv_estimator, gigpo.algorithm.adv_estimator) == ("bi_level_gae", "gigpo")
    assert ppo.model.name == gigpo.model.name == str(tmp_path / "sft")
    assert ppo.filter == gigpo.filter and ppo.filter.enabled  # StarPO-S for every method
    assert ppo.optim.actor_lr == gigpo.optim.actor_lr


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["--env", "sokoban", "--methods", "dqn"],
            "--methods takes one or more of grpo, gigpo, ppo, got dqn",
        ),
        (["--no-base"], "--no-base sets the multi-turn recipe's stages"),
    ],
)
def test_bad_methods_and_stray_recipe_flags_are_one_line(tmp_path, capsys, argv, error):

    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"starpo: error: {error}")
    assert not (tmp_path / "r").exists()


def test_contribution_says_where_the_interval_lies():
    sft = {**ROW, "num_episodes": 256}
    rows = {
        "SFT": sft,
        "SFT + A": {**sft, "success": 0.8, "success_ci95_low": 0.7, "success_ci95_high": 0.9},
        "SFT + B": {**sft, "success": 0.2, "success_ci95_low": 0.1, "success_ci95_high": 0.3},
    }
    results = {"env": "sokoban", "val_seed_start": 123, "preset": "p", "rows": rows, "minutes": {}}
    table = format_results(results)
    assert "A's own contribution: +30.0% (above both 95% intervals)" in table
    assert "B's own contribution: -30.0% (below both 95% intervals)" in table


def test_the_table_shows_optimal_moves_only_where_the_env_judged_them():
    sft = {**ROW, "num_episodes": 256, "optimal_action_rate": 0.35}
    plain = {**ROW, "num_episodes": 256}
    rows = {"SFT": sft, "SFT + A": {**sft, "optimal_action_rate": 0.6}, "random": plain}
    results = {"env": "frozenlake", "val_seed_start": 123, "preset": "p", "rows": rows}
    table = format_results({**results, "minutes": {}}).splitlines()
    assert table[1].endswith("optimal moves")
    assert table[2].endswith("35.0%") and table[3].endswith("60.0%") and table[4].endswith("-")
    unjudged = dict.fromkeys(rows, plain)
    assert "optimal" not in format_results({**results, "rows": unjudged, "minutes": {}})


@pytest.mark.parametrize("env_id", sorted(RECIPES))
def test_every_recipe_runs_its_stages_on_its_own_env(tmp_path, stubbed, env_id):
    results = run_recipe(env_id, tmp_path, RecipeChoices(eval_seeds=3), base_rows=False)
    recipe = RECIPES[env_id]
    assert stubbed["sft"] == [(recipe.sft_episodes, recipe.sft_epochs, recipe.sft_lr)]
    assert [cfg.total_steps for cfg in stubbed["train"]] == [
        load_config(recipe.preset).trainer.total_steps
    ]
    rows = ["SFT", "SFT + GRPO"]
    if recipe.heldout_kwargs:
        rows = ["SFT", "SFT (held-out)", "SFT + GRPO", "SFT + GRPO (held-out)"]
    assert results["env"] == env_id and list(results["rows"]) == rows


def test_a_held_out_case_family_is_scored_for_the_sft_and_rl_models(tmp_path, stubbed, capsys):
    """invoice's recipe also plays split=heldout (unseen vendor names and problem types) with
    the SFT and the RL model, on the same seeds, and compares each RL row with its own SFT
    row; a resumed recipe runs none of it again."""
    results = run_recipe("invoice", tmp_path, RecipeChoices(eval_seeds=5), base_rows=False)
    assert stubbed["evaluate"] == [
        "sft-eval", "sft-heldout-eval", "rl-grpo-eval", "rl-grpo-heldout-eval"
    ]  # fmt: skip
    preset = dict(load_config("cpu-invoice-sft-starpo-s").env.kwargs)
    assert stubbed["env_kwargs"] == [preset, {**preset, "split": "heldout"}] * 2
    rows = results["rows"]
    assert rows["SFT (held-out)"]["label"] == (
        "SFT (128 solver episodes, 2 epochs, lr 2e-4), held-out cases (split=heldout)"
    )
    assert rows["SFT + GRPO (held-out)"]["env_kwargs"] == {**preset, "split": "heldout"}
    assert rows["SFT + GRPO (held-out)"]["num_episodes"] == 5
    table = capsys.readouterr().out
    assert "GRPO's own contribution: +0.0%" in table
    assert "GRPO's own contribution, held-out cases: +0.0%" in table
    run_recipe("invoice", tmp_path, RecipeChoices(eval_seeds=5), base_rows=False)
    assert len(stubbed["evaluate"]) == 4 and len(stubbed["sft"]) == 1


@pytest.mark.parametrize("actions", [1, 3])
def test_the_sft_stage_plays_as_many_actions_a_turn_as_the_rl_layout_holds(
    tmp_path, monkeypatch, actions
):
    """`starpo demo --env sokoban rollout.max_actions_per_turn=3 rollout.max_turns=4`: the
    solver's episodes are cut into turns of up to 3 actions, not 1 (4 moves in all)."""
    import starpo.sft

    asked = {}

    def run_sft(*args, **kwargs):
        asked.update(kwargs)
        return {"epochs": [], "data": {}}

    monkeypatch.setattr(starpo.sft, "run_sft", run_sft)
    layout = [f"rollout.max_actions_per_turn={actions}", "rollout.max_turns=4"]
    recipe = recipe_for("sokoban")
    recipe_module.train_sft(recipe, load_config(recipe.preset, layout), tmp_path / "sft")
    assert asked["actions_per_turn"] == actions


@pytest.mark.slow
def test_a_recipe_continued_to_more_steps_trains_the_steps_one_longer_run_does(
    tmp_path, tiny_model_dir, capsys
):
    """End to end on a tiny model: a 1-step recipe asked for 2 steps continues its RL run
    from the checkpoint, and step 2 logs what step 2 of a 2-step recipe from scratch logs
    (the same SFT model: the second recipe links it)."""
    tiny = [
        f"model.name={tiny_model_dir}", "model.dtype=fp32", "trainer.num_threads=1",
        "rollout.num_groups=2", "rollout.group_size=2", "trainer.val_seeds=3",
        "optim.mini_batch_size=2", "optim.micro_batch_size=2",
    ]  # fmt: skip
    argv = ["--env", "frozenlake", "--quick", "--eval-seeds", "3", "--no-base", "--methods", "grpo"]
    continued, fresh = tmp_path / "continued", tmp_path / "fresh"
    assert main([*argv, "--out", str(continued), "--steps", "1", *tiny]) == 0
    fresh.mkdir()
    for stage in ("sft", "sft-eval"):
        (fresh / stage).symlink_to(continued / stage)
    capsys.readouterr()
    assert main([*argv, "--out", str(continued), "--steps", "2", *tiny]) == 0
    said = capsys.readouterr()
    assert "resumed from step 1" in said.out + said.err
    assert main([*argv, "--out", str(fresh), "--steps", "2", *tiny]) == 0

    def step_two(run: Path) -> dict:
        rows = [json.loads(line) for line in (run / "rl-grpo" / "metrics.jsonl").open()]
        (row,) = [r for r in rows if r["step"] == 2]
        return {k: v for k, v in row.items() if not k.startswith(("timing", "perf", "time"))}

    assert len(step_two(fresh)) > 10 and step_two(continued) == step_two(fresh)
    assert (continued / "rl-grpo-eval-step1" / "stage.json").exists()
    results = json.loads((continued / "results.json").read_text())
    assert results["rl_runs"]["grpo"]["steps"] == 2
