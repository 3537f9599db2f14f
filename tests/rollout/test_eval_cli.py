"""`starpo eval --policy model` end to end, with a tiny random model saved as a local folder."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from starpo.cli import parse_args
from starpo.cli.eval import _rollout_settings_from_args
from starpo.evaluation.model import NO_THINK_MAX_NEW_TOKENS, EvalProgress, evaluate_model
from starpo.rollout.engine import EpisodeSettings
from starpo.stats import pass_at_k


def starpo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "starpo", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tiny) -> Path:
    folder = tmp_path_factory.mktemp("tiny-model")
    model, tokenizer = tiny
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_eval_model_writes_summary_trajectories_and_baselines(tiny_model_dir: Path, tmp_path: Path):
    out = tmp_path / "eval"
    result = starpo(
        "eval",
        "--env",
        "sokoban",
        "--policy",
        "model",
        "--model",
        str(tiny_model_dir),
        "--episodes",
        "3",
        "--samples-per-seed",
        "2",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "6",
        "--out",
        str(out),
        "--quiet",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_episodes"] == 6
    for key in (
        "success",
        "success_ci95_low",
        "success_ci95_high",
        "pass@1",
        "pass@2",
        "valid_action_rate",
        "num_turns",
        "mean_response_tokens",
        "mean_think_tokens",
        "generation_tokens_per_s",
    ):
        assert key in summary, key
    assert summary["mean_response_tokens"] == 6  # random tokens never stop early
    assert summary["generation_tokens_per_s"] > 0
    assert summary["baselines"]["solver"]["success"] == 1.0
    # Sokoban judges moves: the solver's are all optimal; the table gets the column
    assert summary["baselines"]["solver"]["optimal_action_rate"] == 1.0
    assert "optimal" in result.stdout.splitlines()[1]
    assert summary["settings"]["temperature"] == 0.5
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 6
    first = json.loads(lines[0])
    assert {"token_ids", "loss_mask", "logprobs", "messages", "turns"} <= set(first)
    assert [json.loads(line)["seed"] for line in lines] == [123, 123, 124, 124, 125, 125]
    assert "solver" in result.stdout and "random" in result.stdout and "pass@2" in result.stdout


def test_eval_model_bad_input_is_one_line(tmp_path: Path):
    for extra, fragment in (
        (["--model", "./no/such/model"], "does not exist"),
        (["--temperature", "-1"], "--temperature"),
        (["--env", "sokobn"], "did you mean"),
    ):
        args = [
            "eval",
            "--env",
            "sokoban",
            "--policy",
            "model",
            "--episodes",
            "1",
            "--out",
            str(tmp_path / "x"),
            "--quiet",
            *extra,
        ]
        result = starpo(*args)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and fragment in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("n", "c", "k"), [(4, 0, 1), (4, 4, 2), (4, 1, 1), (4, 1, 2), (5, 2, 3), (8, 3, 4), (6, 5, 1)]
)
def test_pass_at_k_matches_enumerating_all_subsets(n: int, c: int, k: int):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    expected = sum(any(subset) for subset in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("flags", "budget"),
    [
        ([], 400),  # think is the default mode
        (["--think"], 400),
        (["--no-think"], NO_THINK_MAX_NEW_TOKENS),
        (["--no-think", "--max-new-tokens", "400"], 400),  # an explicit budget always wins
        (["--max-new-tokens", "7", "--think"], 7),
    ],
)
def test_max_new_tokens_default_follows_the_think_mode(flags: list[str], budget: int):
    args = parse_args(["eval", "--env", "frozenlake", "--policy", "model", "--out", "x", *flags])
    settings = _rollout_settings_from_args(args)
    assert settings.max_new_tokens == budget
    assert settings.stop_at_answer  # a turn ends at </answer> unless asked otherwise


def test_no_think_budget_fits_the_longest_answer():
    from starpo.models import load_tokenizer

    answer = " Right || Right || Right || Right || Right </answer>"  # 5 actions, the most
    assert len(load_tokenizer().encode(answer, add_special_tokens=False)) < NO_THINK_MAX_NEW_TOKENS


def test_evaluate_model_reports_every_turn(tiny_model_dir: Path):
    settings = EpisodeSettings(max_turns=2, max_new_tokens=4)
    seen: list[EvalProgress] = []
    result, _ = evaluate_model(
        "sokoban",
        str(tiny_model_dir),
        seeds=[1, 2, 3],
        settings=settings,
        samples_per_seed=2,
        batch_size=4,  # two seeds (4 episodes), then one (2 episodes)
        on_turn=seen.append,
    )
    # Random tokens never parse, so every episode plays both turns: 2 batches x 2 turns.
    assert [(p.turn, p.max_turns) for p in seen] == [(1, 2), (2, 2), (1, 2), (2, 2)]
    assert [p.episodes_done for p in seen] == [0, 4, 4, 6]
    turn_tokens = [4 * 4, 4 * 4, 2 * 4, 2 * 4]  # episodes in the batch x tokens per turn
    assert [p.generated_tokens for p in seen] == list(itertools.accumulate(turn_tokens))
    generated = sum(t.response_tokens for traj in result.trajectories for t in traj.turns)
    assert seen[-1].generated_tokens == generated
    assert seen[-1].generation_seconds == pytest.approx(result.generation_seconds)
    assert seen[-1].tokens_per_s == pytest.approx(generated / result.generation_seconds)


def test_eval_model_shows_budget_and_turn_progress(tiny_model_dir: Path, tmp_path: Path):
    result = starpo(
        *("eval", "--env", "frozenlake", "--policy", "model", "--model", str(tiny_model_dir)),
        *("--episodes", "2", "--max-turns", "2", "--no-think", "--max-new-tokens", "5"),
        *("--out", str(tmp_path / "e")),
    )
    assert result.returncode == 0, result.stderr
    header = f"eval frozenlake with {tiny_model_dir}: no think, at most 5 new tokens a turn"
    assert result.stdout.splitlines()[0] == header
    assert "2 episodes, model" in result.stdout and "at most 5 new tokens" in result.stdout
    final = result.stderr.split("\r")[-1]  # the bar's last state
    assert re.search(r"2/2 \[.*turn 2/2 \| 20 tok \| \d+ tok/s\]", final), final


def test_eval_model_can_hold_its_cache_in_bf16(tiny_model_dir: Path):
    # --kv-dtype bf16 (rollout.kv_dtype): the lean backend's cache in bf16, said in the
    # summary; the same greedy actions as the fp32 cache on a tiny model's few tokens.
    settings = EpisodeSettings(max_turns=2, max_new_tokens=6, temperature=0.0)
    runs = {
        kv: evaluate_model(
            "frozenlake", str(tiny_model_dir), [0, 1], settings, backend="lean", kv_dtype=kv
        )
        for kv in ("fp32", "bf16")
    }
    assert runs["bf16"][1]["kv_dtype"] == "bfloat16"
    assert runs["fp32"][1]["kv_dtype"] == "float32"
    tokens = {kv: [t.token_ids for t in r.trajectories] for kv, (r, _) in runs.items()}
    assert tokens["bf16"] == tokens["fp32"]
    flags = ["--policy", "model", "--out", "x", "--kv-dtype", "bf16"]
    args = parse_args(["eval", "--env", "frozenlake", *flags])
    assert args.kv_dtype == "bf16"
