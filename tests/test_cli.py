"""End-to-end runs of the `starpo` command (in a subprocess, as a user runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def starpo(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "starpo", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_envs_lists_ids_with_descriptions():
    result = starpo("envs")
    assert result.returncode == 0
    lines = result.stdout.strip().splitlines()
    ids = [line.split()[0] for line in lines]
    assert {"bandit", "frozenlake", "sokoban", "sokoban-large"} <= set(ids)
    assert all(len(line.split()) > 2 for line in lines)


def test_check_env_passes():
    result = starpo("check-env", "frozenlake")
    assert result.returncode == 0, result.stderr
    assert "PASS" in result.stdout


def test_unknown_env_is_one_line_error_with_exit_2():
    for args in (
        ("check-env", "sokobann"),
        (
            "eval",
            "--env",
            "frozenlak",
            "--policy",
            "random",
            "--episodes",
            "2",
            "--out",
            "/tmp/unused-starpo",
        ),
    ):
        result = starpo(*args)
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert "did you mean" in result.stderr


def test_wrong_env_argument_is_one_line_error():
    result = starpo("check-env", "frozenlake", "--env-arg", "sise=6")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "'sise'" in result.stderr and "size" in result.stderr


def test_bad_argument_value_is_one_line_error():
    result = starpo("check-env", "frozenlake", "--env-arg", "p_frozen=1.7")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "p_frozen" in result.stderr


def test_eval_writes_summary_and_trajectories(tmp_path: Path):
    for policy in ("solver", "random"):
        out = tmp_path / policy
        result = starpo(
            "eval",
            "--env",
            "sokoban",
            "--policy",
            policy,
            "--episodes",
            "12",
            "--out",
            str(out),
            "--quiet",
        )
        assert result.returncode == 0, result.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["num_episodes"] == 12
        assert {"success", "reward", "success_ci95_low", "success_ci95_high"} <= set(summary)
        lines = (out / "trajectories.jsonl").read_text().splitlines()
        assert len(lines) == 12
        seeds = [json.loads(line)["seed"] for line in lines]
        assert seeds == list(range(123, 135))
        if policy == "solver":
            # Every generated level is solvable within the budget, so the solver always wins.
            assert summary["success"] == 1.0 and summary["optimal_success"] == 1.0
    random_summary = json.loads((tmp_path / "random" / "summary.json").read_text())
    assert random_summary["success"] < 1.0


def test_eval_frozenlake_solver_beats_random(tmp_path: Path):
    rates = {}
    for policy in ("solver", "random"):
        out = tmp_path / policy
        result = starpo(
            "eval",
            "--env",
            "frozenlake",
            "--policy",
            policy,
            "--episodes",
            "200",
            "--out",
            str(out),
            "--quiet",
        )
        assert result.returncode == 0, result.stderr
        rates[policy] = json.loads((out / "summary.json").read_text())["success"]
    assert rates["solver"] > rates["random"] + 0.15


def test_play_reads_actions_from_stdin():
    result = starpo("play", "bandit", "--seed", "3", stdin="pull the lever\nDragon\n")
    assert result.returncode == 0, result.stderr
    assert "not an action" in result.stdout
    assert "You pulled Dragon" in result.stdout
    assert "SUCCESS" in result.stdout


def test_play_takes_typed_tool_calls_and_shows_each_result():
    from starpo.envs import make

    env = make("invoice")
    env.reset(seed=5)
    lines = ["nonsense {}", "search_vendors {broken"]
    while not env.done:  # the gold calls, typed as NAME {JSON arguments}
        call = json.loads(env.optimal_action())
        lines.append(f"{call['name']} {json.dumps(call['arguments'])}")
        env.step(env.optimal_action())
    result = starpo("play", "invoice", "--seed", "5", stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    assert 'Error: unknown tool "nonsense"' in result.stdout
    assert "Error: the call is not valid JSON" in result.stdout
    assert "search_vendors(name)" in result.stdout  # the tools, listed with their arguments
    assert "SUCCESS" in result.stdout


def test_play_quits_on_eof():
    result = starpo("play", "sokoban", "--seed", "3", stdin="up\n")
    assert result.returncode == 0
    assert "stopped." in result.stdout


def test_demo_env_showcase_plays_every_env():
    result = subprocess.run(
        [sys.executable, "-m", "starpo", "demo", "--envs"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = result.stdout.split("summary (seed 123):")[1]
    from starpo.cli.demo import DEMO_ENVS

    for env_id in DEMO_ENVS:
        assert f"{env_id} " in summary
    for env_id in ("countdown", "sudoku", "qa", "2048-3x3"):  # free text and the long game
        assert f"{env_id}" + " " * (18 - len(env_id)) + "solver  success" in summary
    # the solver wins every env but the slippery ice
    assert summary.count("solver  success") >= len(DEMO_ENVS) - 1


def test_train_overrides_may_stand_anywhere():
    from starpo.cli import parse_args

    argv = ["train", "a.b=1", "--quiet", "c=2", "--out", "r", "--config", "x", "d=3", "--resume"]
    args = parse_args(argv)
    assert args.overrides == ["a.b=1", "c=2", "d=3"]  # in the order given: later ones win
    assert (args.quiet, args.resume, args.config, args.out) == (True, "latest", "x", "r")
    for bad in (["train", "--out", "r", "a=1", "--quiet", "--nope"], ["envs", "a=1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_an_override_after_a_flag_reaches_the_config(tmp_path: Path):
    out = str(tmp_path / "run")
    overrides = ("trainer.total_steps=1", "--quiet", "optim.actor_lr=0")  # two runs of them
    result = starpo("train", *overrides, "--out", out, "--config", "cpu-tiny-smoke")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "starpo: error: optim.actor_lr must be > 0.0, got 0; e.g. optim.actor_lr=1.0e-06"
    ]


def test_unknown_preset_lists_the_presets(tmp_path: Path):
    result = starpo("train", "--config", "cpu-tiny-smok", "--out", str(tmp_path / "r"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "did you mean 'cpu-tiny-smoke'?" in result.stderr
    assert "bandit-starpo-s" in result.stderr and "sokoban-starpo" in result.stderr


def test_train_help_imports_no_torch():
    code = (
        "import runpy, sys\n"
        "sys.argv = ['starpo', 'train', '--help']\n"
        "try:\n    runpy.run_module('starpo', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('torch imported' if 'torch' in sys.modules else 'no torch')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "diagnostics.ema_alpha" in result.stdout and "cpu-tiny-smoke" in result.stdout
    assert result.stdout.strip().endswith("no torch")


def test_the_command_loads_every_subcommand_without_numpy_or_torch():
    # `starpo` imports every subcommand's module to build its parser: each keeps what its
    # command needs (envs and numpy, torch, models) inside the command, so `starpo --help`
    # and a mistyped flag answer at once.
    code = "import sys, starpo.cli; print(sorted({'numpy', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
