"""Rejection-sampling fine-tuning: a round keeps only the successful episodes and trains on
the model's own tokens; the recipe's RFT stage (`--rft-rounds`) samples from the newest
model on training seeds of its own, reports what it kept, starts RL from the last round,
and refuses a resume with other RFT settings."""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pytest

from starpo.errors import UserError
from starpo.models import load_tokenizer
from starpo.recipe import stages as recipe_module
from starpo.recipe.methods import RecipeChoices
from starpo.recipe.rft import rft_seeds
from starpo.recipe.stages import configure, run_recipe
from starpo.rollout import EpisodeSettings, RolloutEngine
from starpo.rollout.backends.base import Generation, GenerationRequest, SamplingParams
from starpo.sft import rejection
from starpo.sft.data import SOLVER_SEED_START
from starpo.sft.options import TrainOptions
from starpo.sft.rejection import check_training_seeds, keep_successes, rft_round
from starpo.sft.replay import cut_generation
from starpo.sft.responses import recorded_turn_tokens
from starpo.types import Trajectory

SETTINGS = EpisodeSettings(max_turns=8, max_actions_per_turn=1, think=False, max_new_tokens=24)
MOVES = ("Left", "Down", "Right", "Up")


class MovingBackend:
    """A "model" that answers a uniformly random move, spelled one character a token (not
    how the tokenizer would encode the text), cut where a real backend would stop."""

    def __init__(self, tokenizer, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.rng = np.random.default_rng(seed)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def generate(self, requests: list[GenerationRequest], params: SamplingParams):
        out = []
        for _ in requests:
            move = str(self.rng.choice(MOVES))
            tokens = self._ids(" ") + [t for ch in move for t in self._ids(ch)]
            generation, _ = cut_generation(tokens + self._ids(" </answer>"), params)
            out.append(Generation(generation.token_ids, [-0.7] * len(generation.token_ids),
                                  generation.finish_reason, generation.stop_ids))  # fmt: skip
        return out

    def release(self, sessions: Iterable[int]) -> None:
        list(sessions)

    def reset(self) -> None:
        pass

    def seed(self, seed: int) -> None:
        pass

    def update_weights(self, model, version: int) -> None:
        pass


def _sampler(tokenizer, played: list[Trajectory]):
    """`rejection.sample_episodes` with the moving backend on non-slippery FrozenLake."""

    def sample(model, env_id, seeds, samples_per_seed, settings, **kwargs):
        engine = RolloutEngine(MovingBackend(tokenizer), tokenizer, settings)
        trajectories = engine.run(env_id, list(seeds), samples_per_seed,
                                  env_kwargs=kwargs["env_kwargs"])  # fmt: skip
        played.extend(trajectories)
        return trajectories, {"success": sum(t.success for t in trajectories)}

    return sample


def test_keep_successes_leaves_out_failures_and_broken_envs():
    won, lost = Trajectory("frozenlake", 1, 0, success=True), Trajectory("frozenlake", 2, 1)
    broken = Trajectory("frozenlake", 3, 2, success=True, error="step: TimeoutError")
    assert keep_successes([won, lost, broken]) == [won]


def test_rft_never_samples_validation_seeds():
    assert check_training_seeds(range(100_000, 100_008)) == range(100_000, 100_008)
    with pytest.raises(UserError, match="overlap the validation seeds"):
        check_training_seeds(range(100, 200))


def test_a_round_trains_on_its_successes_token_for_token(tmp_path, tiny_model_dir, monkeypatch):
    tokenizer = load_tokenizer(tiny_model_dir)
    played: list[Trajectory] = []
    monkeypatch.setattr(rejection, "sample_episodes", _sampler(tokenizer, played))
    out = tmp_path / "rft-1"
    record = rft_round(
        str(tiny_model_dir), out, "frozenlake", SETTINGS, seeds=range(100_000, 100_016),
        samples_per_seed=4, options=TrainOptions(epochs=1, val_fraction=0.0),
        env_kwargs={"is_slippery": False},
    )  # fmt: skip
    wins = [t for t in played if t.success]
    assert 0 < len(wins) < len(played) == 64  # random moves: some succeed, most do not
    assert (record["sampled"], record["kept"], record["trained"]) == (64, len(wins), True)
    assert record["kept_share"] == len(wins) / 64 and record["model"] == str(out)
    assert record["seeds_with_a_success"] == len({t.seed for t in wins})
    assert (out / "config.json").exists()  # the fine-tuned model
    samples = (out / "samples" / "trajectories.jsonl").read_text().splitlines()
    assert len(samples) == 64  # every sample kept for inspection, failures included
    trained = [Trajectory.from_json(line) for line in open(out / "sft_data.jsonl")]
    # Exactly the successes, each the very tokens the model sampled: its replies are spelled
    # one character a token, which re-tokenising the text would not give back.
    assert [t.token_ids for t in trained] == [t.token_ids for t in wins]
    assert [t.loss_mask for t in trained] == [t.loss_mask for t in wins]
    first_turn = recorded_turn_tokens(wins[0])[0]
    reply = wins[0].turns[0].response.removeprefix("<answer>")
    assert tokenizer.decode(first_turn) == reply
    assert tokenizer.encode(reply, add_special_tokens=False) != first_turn


def test_a_round_without_a_success_keeps_the_model_it_sampled(tmp_path, monkeypatch):
    lost = [Trajectory("frozenlake", 100_000, 0, final_state="x")]
    monkeypatch.setattr(rejection, "sample_episodes", lambda *a, **k: (lost, {}))
    record = rft_round("some/model", tmp_path / "rft-1", "frozenlake", SETTINGS,
                       seeds=range(100_000, 100_001), samples_per_seed=1,
                       options=TrainOptions())  # fmt: skip
    assert (record["kept"], record["trained"], record["model"]) == (0, False, "some/model")
    assert not (tmp_path / "rft-1" / "config.json").exists()


def test_a_round_run_again_reuses_its_samples_and_a_changed_one_samples_afresh(
    tmp_path, tiny_model_dir, monkeypatch
):
    """A crash in fine-tuning loses no sampling: the rerun trains on exactly the episodes
    drawn before. Other seeds, or samples cut short, are drawn again."""
    tokenizer = load_tokenizer(tiny_model_dir)
    played: list[Trajectory] = []
    monkeypatch.setattr(rejection, "sample_episodes", _sampler(tokenizer, played))
    out, seeds = tmp_path / "rft-1", range(100_000, 100_008)

    def crash(*args, **kwargs):
        raise RuntimeError("killed while fine-tuning")

    monkeypatch.setattr("starpo.sft.run.run_sft", crash)
    args = (str(tiny_model_dir), out, "frozenlake", SETTINGS)
    kwargs = dict(samples_per_seed=4, options=TrainOptions(epochs=1, val_fraction=0.0),
                  env_kwargs={"is_slippery": False})  # fmt: skip
    with pytest.raises(RuntimeError, match="killed"):
        rft_round(*args, seeds=seeds, **kwargs)
    drawn = list(played)
    assert len(drawn) == 32 and (out / "samples" / rejection.SAMPLED_FILE).exists()
    monkeypatch.undo()  # the real fine-tuning again, and a sampler that must not be called
    monkeypatch.setattr(rejection, "sample_episodes", lambda *a, **k: pytest.fail("resampled"))
    record = rft_round(*args, seeds=seeds, **kwargs)
    trained = [Trajectory.from_json(line) for line in open(out / "sft_data.jsonl")]
    assert [t.token_ids for t in trained] == [t.token_ids for t in drawn if t.success]
    assert record["sampled"] == 32 and record["kept"] == len(trained) > 0

    played.clear()
    monkeypatch.setattr(rejection, "sample_episodes", _sampler(tokenizer, played))
    rft_round(*args, seeds=range(100_000, 100_006), **kwargs)  # other seeds: drawn again
    assert len(played) == 24
    lines = (out / "samples" / "trajectories.jsonl").read_text().splitlines()
    (out / "samples" / "trajectories.jsonl").write_text("\n".join(lines[:5]) + "\n")
    played.clear()
    rft_round(*args, seeds=range(100_000, 100_006), **kwargs)  # cut short: drawn again
    assert len(played) == 24


# ------------------------------------------------------------------------ the recipe
ROW = {"success": 0.5, "success_ci95_low": 0.4, "success_ci95_high": 0.6, "format_ok": 1.0}


@pytest.fixture
def stubbed(monkeypatch):
    """Evaluations, SFT, RFT rounds and the trainer stubbed; what each was asked is kept."""
    calls: dict[str, list] = {"evaluate": [], "sft": [], "rft": [], "train": []}

    def evaluate(model, cfg, folder, settings, seeds, env_kwargs):
        calls["evaluate"].append((folder.name, model))
        return {"model": model, **ROW, "num_episodes": seeds}

    def train_sft(recipe, cfg, sft_dir):
        calls["sft"].append((recipe.sft_from, cfg.rollout.think, cfg.rollout.max_new_tokens))
        sft_dir.mkdir(parents=True)
        return {"epochs": [], "data": {}}

    def train_rft(recipe, cfg, folder, model, round_, dtype):
        seeds = rft_seeds(recipe, round_)
        calls["rft"].append((model, seeds, recipe.rft_samples, recipe.rft_epochs))
        kept = round_  # round 1 keeps 1 episode, round 2 keeps 2
        return {"sampled": len(seeds) * recipe.rft_samples, "kept": kept, "seeds":
                [seeds.start, seeds.stop - 1], "model": str(folder), "trained": True}  # fmt: skip

    class Trainer:
        def __init__(self, cfg, run_dir, resume=False):
            calls["train"].append(cfg)
            self.run_dir = run_dir

        def train(self):
            self.run_dir.mkdir(parents=True)
            (self.run_dir / "metrics.jsonl").write_text('{"step": 1}\n')

    monkeypatch.setattr(recipe_module, "evaluate", evaluate)
    monkeypatch.setattr(recipe_module, "train_sft", train_sft)
    monkeypatch.setattr(recipe_module, "train_rft", train_rft)
    monkeypatch.setattr("starpo.trainer.Trainer", Trainer)
    return calls


def demo(*argv: str) -> int:
    from starpo.cli import main

    try:
        return main(["demo", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


def test_rft_rounds_sample_from_the_newest_model_and_rl_starts_from_the_last(
    tmp_path, stubbed, capsys
):
    argv = ["--env", "frozenlake", "--out", str(tmp_path), "--eval-seeds", "3", "--no-base"]
    rft = ["--rft-rounds", "2", "--rft-seeds", "16", "--rft-samples", "4"]
    assert demo(*argv, "--sft-from", "random", "--sft-episodes", "32", *rft) == 0
    first, second = stubbed["rft"]
    assert first == (str(tmp_path / "sft"), range(SOLVER_SEED_START + 32, SOLVER_SEED_START + 48),
                     4, 1)  # fmt: skip
    assert second == (str(tmp_path / "rft-1"), range(SOLVER_SEED_START + 48,
                      SOLVER_SEED_START + 64), 4, 1)  # fmt: skip
    (rl_cfg,) = stubbed["train"]
    assert rl_cfg.model.name == str(tmp_path / "rft-2")
    assert ("rft-eval", str(tmp_path / "rft-2")) in stubbed["evaluate"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results["rows"]) == ["SFT", "SFT + RFT", "SFT + RFT + GRPO"]
    assert results["rows"]["SFT + RFT"]["label"] == (
        "SFT + RFT (2 rounds of 16 seeds x 4 samples: 3 of 128 kept, 1 epoch, lr 1e-4)"
    )
    assert [r["kept"] for r in results["rft_rounds"]] == [1, 2]
    assert results["settings"]["rft_rounds"] == 2 and results["settings"]["rft_lr"] == 1e-4
    table = capsys.readouterr().out
    assert "RFT's own contribution: +0.0%" in table  # against SFT
    assert "GRPO's own contribution: +0.0%" in table  # against SFT + RFT, where RL started
    # A resume with other RFT settings is refused, naming the first stage made otherwise.
    assert demo(*argv, "--sft-from", "random", "--sft-episodes", "32", *rft[:4], "--rft-samples",
                "8") == 2  # fmt: skip
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"starpo: error: {tmp_path / 'rft-1'} was made with --rft-samples 4, not --rft-samples 8"
    )
    # Without RFT, the RL stage that started from RFT's model is not taken as RL from SFT.
    assert demo(*argv, "--sft-from", "random", "--sft-episodes", "32") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"{tmp_path / 'rl-grpo'} was made with --rft-rounds 2" in line
    # The same settings resume: nothing runs again.
    done = len(stubbed["rft"])
    assert demo(*argv, "--sft-from", "random", "--sft-episodes", "32", *rft) == 0
    assert len(stubbed["rft"]) == done and capsys.readouterr().out.count("done before") == 7


def test_a_run_with_one_more_round_keeps_the_rounds_it_has(tmp_path, stubbed, capsys):
    # A second round's run beside a finished one-round run: its round 1 is the one-round
    # run's (linked), so only round 2 samples; RFT's evaluation and RL start afresh.
    argv = ["--env", "frozenlake", "--eval-seeds", "3", "--no-base", "--sft-from", "random",
            "--rft-seeds", "16", "--rft-samples", "4"]  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    assert demo(*argv, "--out", str(one), "--rft-rounds", "1") == 0
    two.mkdir()
    for folder in ("sft", "sft-eval", "rft-1"):
        (two / folder).symlink_to(one / folder)
    capsys.readouterr()
    assert demo(*argv, "--out", str(two), "--rft-rounds", "2") == 0
    # Round 2 samples from round 1's model, where its record says it was made.
    assert [model for model, *_ in stubbed["rft"]] == [str(one / "sft"), str(one / "rft-1")]
    assert "[RFT 1] done before" in capsys.readouterr().out
    (_, rl_cfg) = stubbed["train"]
    assert rl_cfg.model.name == str(two / "rft-2")
    kept = json.loads((two / "rft-2" / "stage.json").read_text())
    assert kept["settings"]["rft_rounds"] == 2
    # The one-round run's later stages are not taken for the two-round run's.
    assert demo(*argv, "--out", str(one), "--rft-rounds", "2") == 2
    assert f"{one / 'rft-eval'} was made with --rft-rounds 1" in capsys.readouterr().err


def test_without_rft_the_recipe_records_and_rows_are_unchanged(tmp_path, stubbed):
    results = run_recipe("frozenlake", tmp_path, RecipeChoices(eval_seeds=3), base_rows=False)
    assert list(results["rows"]) == ["SFT", "SFT + GRPO"]
    assert "rft_rounds" not in results and not stubbed["rft"]
    assert not any(key.startswith("rft") for key in results["settings"])


def test_a_round_that_keeps_nothing_passes_its_model_on(tmp_path, stubbed, monkeypatch):
    def keeps_nothing(recipe, cfg, folder, model, round_, dtype):
        return {"sampled": 8, "kept": 0, "model": model, "trained": False}

    monkeypatch.setattr(recipe_module, "train_rft", keeps_nothing)
    run_recipe("frozenlake", tmp_path, RecipeChoices(eval_seeds=3, rft_rounds=1),
               base_rows=False)  # fmt: skip
    (rl_cfg,) = stubbed["train"]
    assert rl_cfg.model.name == str(tmp_path / "sft")


def test_world_model_sft_turns_thinking_on_in_the_recipe(tmp_path, stubbed, capsys):
    argv = ["--env", "frozenlake", "--out", str(tmp_path), "--eval-seeds", "3", "--no-base"]
    assert demo(*argv, "--sft-from", "world-model") == 0
    assert stubbed["sft"] == [("world-model", True, 128)]
    (rl_cfg,) = stubbed["train"]
    assert rl_cfg.rollout.think  # RL plays the format SFT taught
    label = json.loads((tmp_path / "results.json").read_text())["rows"]["SFT"]["label"]
    assert label == "SFT (200 random-policy episodes: world model, 3 epochs, lr 2e-4)"
    capsys.readouterr()
    assert demo(*argv, "--sft-from", "world-model", "rollout.think=false") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("starpo: error: world-model SFT writes the state")
    assert "rollout.think=true" in line


LR = "--rft-lr must be a learning rate above 0, got"
ADD = "sets the RFT stage: add --rft-rounds N (1 or more)"


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--rft-rounds", "-1"], "--rft-rounds must be at least 0 (0: no RFT stage), got -1"),
        (["--rft-rounds", "1", "--rft-seeds", "0"], "--rft-seeds must be at least 1, got 0"),
        (["--rft-rounds", "1", "--rft-samples", "-3"], "--rft-samples must be at least 1, got -3"),
        (["--rft-rounds", "1", "--rft-epochs", "0"], "--rft-epochs must be at least 1, got 0"),
        (["--rft-rounds", "1", "--rft-lr", "0"], f"{LR} 0"),
        (["--rft-rounds", "1", "--rft-lr", "nan"], f"{LR} nan"),
        (["--rft-samples", "4"], f"--rft-samples {ADD}"),
        (["--rft-rounds", "0", "--rft-lr", "1e-5"], f"--rft-lr {ADD}"),
        (["--rft-rounds", "two"], "argument --rft-rounds: invalid int value: 'two'"),
        (["--sft-from", "world"], "argument --sft-from: invalid choice: 'world'"),
    ],
)
def test_bad_rft_flags_are_one_line_before_any_work(tmp_path, capsys, flags, error):
    assert demo("--env", "frozenlake", "--out", str(tmp_path / "r"), *flags) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"starpo: error: {error}")
    assert not (tmp_path / "r").exists()


def test_rft_flags_need_the_recipe(capsys):
    assert demo("--rft-rounds", "1") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("starpo: error: --rft-rounds sets the multi-turn recipe's stages")


def test_quick_samples_a_few_seeds_and_the_callers_values_win():
    recipe, _ = configure("frozenlake", RecipeChoices(rft_rounds=1), quick=True)
    assert (recipe.rft_rounds, recipe.rft_seeds, recipe.rft_samples) == (1, 8, 4)
    recipe, _ = configure("frozenlake", RecipeChoices(rft_rounds=1, rft_seeds=32), quick=True)
    assert recipe.rft_seeds == 32


@pytest.mark.slow
def test_the_recipe_with_world_model_sft_and_rft_runs_end_to_end_and_resumes(
    tmp_path, tiny_model_dir, capsys
):
    overrides = [
        f"model.name={tiny_model_dir}", "model.dtype=fp32", "rollout.num_groups=2",
        "rollout.group_size=2", "rollout.max_turns=2", "rollout.max_new_tokens=96",
        "trainer.val_seeds=2", "trainer.total_steps=1", "trainer.save_every=1",
        "optim.mini_batch_size=2", "optim.micro_batch_size=2",
    ]  # fmt: skip
    choices = RecipeChoices(eval_seeds=2, sft_from="world-model", rft_rounds=1, rft_seeds=2,
                            rft_samples=2)  # fmt: skip
    results = run_recipe("frozenlake", tmp_path, choices, quick=True, overrides=overrides,
                         base_rows=False)  # fmt: skip
    assert list(results["rows"]) == ["SFT", "SFT + RFT", "SFT + RFT + GRPO"]
    (round_,) = results["rft_rounds"]
    samples = (tmp_path / "rft-1" / "samples" / "trajectories.jsonl").read_text().splitlines()
    assert round_["sampled"] == len(samples) == 4
    assert round_["kept"] == sum(json.loads(line)["success"] for line in samples)
    kept = json.loads((tmp_path / "rft-1" / "stage.json").read_text())
    assert kept["settings"]["rft_rounds"] == 1 and kept["seeds"] == [100_016, 100_017]
    sft = json.loads((tmp_path / "sft" / "sft_summary.json").read_text())
    assert sft["data"]["from_world_model"] == 16 and sft["settings"]["think"]
    assert (tmp_path / "rl-grpo" / "final" / "config.json").exists()
    capsys.readouterr()
    again = run_recipe("frozenlake", tmp_path, choices, quick=True, overrides=overrides,
                       base_rows=False)  # fmt: skip
    assert capsys.readouterr().out.count("done before") == 6  # sft, RFT, RL and their evals
    assert again["rows"] == results["rows"]
