"""`starpo sft` as a user runs it, and its one-line errors for bad input."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from starpo.cli.sft import add_parser
from starpo.errors import UserError
from starpo.evaluation.scripted import play_episodes
from starpo.evaluation.summary import write_results
from starpo.sft.data import policy_records, read_records
from starpo.sft.run import NOT_SUCCESSFUL, SUMMARY_FILE, gather_records, keep_by_outcome
from starpo.types import Trajectory


def sft(*argv: str) -> int:
    """`starpo sft ARGV` through its own parser (as `starpo.cli` wires it)."""
    parser = argparse.ArgumentParser(prog="starpo")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sft", *argv])
    return args.func(args)


@pytest.fixture
def solver_file(tmp_path: Path) -> Path:
    episodes = list(play_episodes("bandit", "solver", 6, seed_start=5000))
    write_results(tmp_path / "eval", episodes, {})
    return tmp_path / "eval" / "trajectories.jsonl"


@pytest.mark.slow
def test_sft_cli_with_a_train_config_then_eval_of_its_output(
    tmp_path, tiny_model_dir, solver_file, capsys
):
    from starpo.cli import main

    out = tmp_path / "sft"
    args = ["--config", "cpu-bandit-starpo-s", "--model", str(tiny_model_dir), "--epochs", "1"]
    assert sft(str(solver_file.parent), *args, "--out", str(out), "--quiet") == 0
    printed = capsys.readouterr().out
    assert "records 6, kept 6" in printed and "wrote the model" in printed
    summary = json.loads((out / SUMMARY_FILE).read_text())
    # The RL preset's layout: no think block, one turn, its token budget.
    assert summary["settings"]["think"] is False and summary["settings"]["max_turns"] == 1
    assert summary["settings"]["max_new_tokens"] == 12
    assert summary["options"]["epochs"] == 1
    evaluated = tmp_path / "eval-sft"
    code = main(
        ["eval", "--env", "bandit", "--policy", "model", "--model", str(out), "--episodes", "2"]
        + ["--max-new-tokens", "8", "--quiet", "--out", str(evaluated)]
    )
    assert code == 0 and (evaluated / "summary.json").is_file()


def test_sft_cli_from_random_trains_on_every_random_episode(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "warm"
    args = ["--config", "cpu-frozenlake-sft-starpo-s", "--model", str(tiny_model_dir)]
    assert sft(*args, "--from-random", "4", "--epochs", "1", "--out", str(out), "--quiet") == 0
    assert "records 4, kept 4" in capsys.readouterr().out
    data = json.loads((out / SUMMARY_FILE).read_text())["data"]
    assert (data["from_random"], data["from_solver"], data["kept"]) == (4, 0, 4)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        read_records([tmp_path / "nope.jsonl"])


def test_broken_line_names_file_and_line(solver_file):
    lines = solver_file.read_text().splitlines()
    solver_file.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(UserError, match=rf"{solver_file}:2 is not valid JSON"):
        read_records([solver_file])


def test_object_that_is_no_record_names_file_and_line(solver_file):
    solver_file.write_text('{"step": 3, "loss": 1.0}\n')
    with pytest.raises(UserError, match=rf"{solver_file}:1 is not a trajectory or episode"):
        read_records([solver_file])


def test_torn_last_line_is_a_counted_skip(solver_file):
    text = solver_file.read_text()
    solver_file.write_text(text + '{"env_id": "band')
    loaded = read_records([solver_file])
    assert len(loaded.records) == 6 and loaded.torn_lines == 1


def test_no_data_is_a_user_error():
    with pytest.raises(UserError, match="no SFT data"):
        gather_records([])
    with pytest.raises(UserError, match="--env"):
        gather_records([], from_solver=3)


def test_solver_seeds_must_avoid_validation_seeds():
    with pytest.raises(UserError, match="overlap the validation seeds"):
        policy_records("bandit", 10, seed_start=120)


def test_records_on_validation_seeds_are_counted():
    from starpo.sft.data import warn_validation_seeds

    records = list(play_episodes("bandit", "solver", 3, seed_start=377))  # 377, 378, 379
    assert warn_validation_seeds(records) == 2


def test_only_success_rule():
    solver = next(iter(play_episodes("frozenlake", "solver", 1)))
    failed_solver = solver.__class__(**{**solver.__dict__, "success": False})
    failed_model = Trajectory(env_id="bandit", seed=1, group=0, success=False)
    assert keep_by_outcome(failed_solver, None)  # auto: solver moves are optimal anyway
    assert not keep_by_outcome(failed_model, None)
    assert not keep_by_outcome(failed_solver, True)
    assert keep_by_outcome(failed_model, False)


def test_from_random_plays_a_format_only_warm_start_kept_whatever_its_outcome():
    loaded = gather_records([], from_solver=2, from_random=6, env_id="frozenlake")
    played = loaded.records[2:]
    assert loaded.sources == ["solver"] * 2 + ["random"] * 6
    assert [r.seed for r in played] == list(range(100_002, 100_008))  # after the solver's
    assert {r.policy for r in played} == {"random"}
    failed = next(r for r in played if not r.success)  # random play on 4x4 ice mostly fails
    assert keep_by_outcome(failed, None, "random")  # auto: the turns' form is the lesson
    assert not keep_by_outcome(failed, None, "runs/eval/trajectories.jsonl:3")  # a file's
    assert not keep_by_outcome(failed, True, "random")
    with pytest.raises(UserError, match="--from-random needs --env"):
        gather_records([], from_random=3)


def test_from_weak_plays_after_the_random_policy_with_its_skill_and_keeps_failures():
    loaded = gather_records(
        [], from_random=2, from_weak=40, weak_skill=0.5, env_id="frozenlake", seed_start=200_000
    )
    weak = loaded.records[2:]
    assert loaded.sources == ["random"] * 2 + ["weak"] * 40
    assert [r.seed for r in weak] == list(range(200_002, 200_042))  # after the random's
    assert {r.policy for r in weak} == {"weak"}
    failed = next(r for r in weak if not r.success)
    assert keep_by_outcome(failed, None, "weak")  # auto: the policy's own lean is the lesson
    assert not keep_by_outcome(failed, None, "runs/eval/trajectories.jsonl:3")

    # skill 1 is the solver's play move for move; less skill, fewer successes
    def play(policy, skill):
        ice = {"is_slippery": False}
        return list(play_episodes("frozenlake", policy, 100, env_kwargs=ice, weak_skill=skill))

    def success(records):
        return sum(r.success for r in records) / len(records)

    solver = play("solver", 0.5)
    assert [r.steps for r in play("weak", 1.0)] == [r.steps for r in solver]
    shares = [success(play("weak", skill)) for skill in (0.0, 0.5, 0.75)]
    assert shares == sorted(shares) and shares[-1] < success(solver) == 1.0
    assert abs(shares[0] - success(play("random", 0.5))) < 0.1


def test_weak_policy_needs_a_solver_and_a_skill_between_0_and_1(tmp_path):
    with pytest.raises(UserError, match="--weak-skill must be a share between 0 and 1"):
        gather_records([], from_weak=3, weak_skill=1.5, env_id="frozenlake")
    with pytest.raises(UserError, match="--weak-skill"):
        sft("--from-weak", "2", "--weak-skill", "-0.1", "--env", "bandit", "--out", str(tmp_path))


def test_only_failures_leave_nothing_to_train_on(tmp_path, tiny_model_dir):
    from starpo.sft.run import run_sft

    failures = [Trajectory(env_id="bandit", seed=5000 + i, group=0) for i in range(3)]
    with pytest.raises(UserError, match=f"none of the 3 records.*{re.escape(NOT_SUCCESSFUL)}"):
        run_sft(str(tiny_model_dir), failures, out=tmp_path / "x", quiet=True)


def test_the_parser_needs_no_torch_and_knows_the_trainers_schedules():
    """`starpo --help` builds every parser: this one must not import torch."""
    import subprocess
    import sys

    code = (
        "import argparse, sys\n"
        "from starpo.cli.sft import add_parser\n"
        "add_parser(argparse.ArgumentParser().add_subparsers())\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
    from starpo.compute.lr_schedule import SCHEDULES as TRAINER_SCHEDULES
    from starpo.sft.options import SCHEDULES

    assert SCHEDULES == TRAINER_SCHEDULES
