"""`starpo eval --policy model` end to end, with a tiny random model saved as a local folder."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
        (["--env", "sokobn"], "Did you mean"),
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
