"""World-model SFT (SPA-style): the turn layout, random-play episodes replayed as
world-model turns, think required, and the measure that reads predictions back."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from starpo.errors import UserError
from starpo.evaluation.summary import write_results
from starpo.evaluation.world_model import (
    field_matches,
    normalise_state,
    score_trajectories,
    states_after,
    tagged,
    world_model_rationale,
)
from starpo.models import load_tokenizer
from starpo.rollout import EpisodeSettings
from starpo.sft.data import WORLD_MODEL, policy_records
from starpo.sft.replay import replay_records
from starpo.sft.responses import solver_turn_text
from starpo.sft.run import gather_records, keep_by_outcome
from starpo.types import Trajectory, Turn

_SPEC = importlib.util.spec_from_file_location(
    "world_model_accuracy", Path(__file__).parents[1] / "experiments" / "world_model_accuracy.py"
)
world_model_accuracy = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(world_model_accuracy)


def test_a_world_model_turn_reads_the_state_and_predicts_the_next_in_the_think_block():
    rationale = world_model_rationale("_P\nG_", "__\nGP")
    assert solver_turn_text(["Down", "Left"], rationale, True) == (
        " <observation>_P\nG_</observation> <prediction>__\nGP</prediction> </think>"
        " <answer> Down || Left </answer>"
    )


@pytest.mark.parametrize(("env_id", "per_turn"), [("frozenlake", 1), ("sokoban", 2)])
def test_random_play_replays_as_world_model_turns_whose_fields_are_the_envs_states(
    env_id, per_turn
):
    tokenizer = load_tokenizer()
    settings = EpisodeSettings(max_turns=20, max_actions_per_turn=2, max_new_tokens=160)
    records = policy_records(env_id, 4, policy="random").records
    result = replay_records(
        records, tokenizer, settings, actions_per_turn=per_turn, world_model=True
    )
    assert not result.skipped and len(result.examples) == len(records)
    for record, traj in zip(records, result.examples, strict=True):
        states = [record.initial_observation, *(s.observation for s in record.steps)]
        actions = [s.action for s in record.steps]
        assert [a for t in traj.turns for a in t.executed] == actions
        for i, turn in enumerate(traj.turns):
            first, last = i * per_turn, min((i + 1) * per_turn, len(actions))
            assert turn.format_ok
            assert turn.response == "<think>" + solver_turn_text(
                actions[first:last], world_model_rationale(states[first], states[last]), True
            )
            assert turn.state == states[first]  # the engine showed what the record holds
        assert states_after(traj)[-1] == states[-1]
    # The measure agrees: data made from the env's own transitions is exactly right.
    rates = score_trajectories(result.examples).rates()
    assert rates["turns"] == sum(len(t.turns) for t in result.examples)
    assert rates["prediction_exact"] == rates["observation_exact"] == 1.0


def test_world_model_turns_need_a_think_block():
    tokenizer = load_tokenizer()
    records = policy_records("frozenlake", 1, policy="random").records
    with pytest.raises(UserError, match="turn thinking on") as info:
        replay_records(records, tokenizer, EpisodeSettings(think=False), world_model=True)
    assert "\n" not in str(info.value)


def test_world_model_records_are_random_play_kept_whatever_their_outcome():
    loaded = gather_records((), env_id="frozenlake", from_random=3, from_world_model=5)
    assert loaded.sources == ["random"] * 3 + [WORLD_MODEL] * 5
    assert [r.seed for r in loaded.records] == list(range(100_000, 100_008))  # seeds of its own
    assert all(r.policy == "random" for r in loaded.records)
    failed = next(r for r in loaded.records[3:] if not r.success)
    assert keep_by_outcome(failed, None, WORLD_MODEL)
    assert not keep_by_outcome(failed, True, WORLD_MODEL)
    with pytest.raises(UserError, match="--from-world-model needs --env"):
        gather_records((), from_world_model=2)


# ----------------------------------------------------------------- reading a reply back
@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<think> <prediction>_P\nG_</prediction> </think>", "_P\nG_"),
        ("<think> <prediction></prediction> </think>", ""),
        ("<think> I move down. </think> <answer> Down </answer>", None),  # missing
        ("<think> <prediction>_P\nG_ </think> <answer> Down </answer>", None),  # unclosed
        ("<think> _P\nG_</prediction> </think>", None),  # never opened
        ("<prediction>_P<prediction>G_</prediction>", None),  # opened twice
        ("<prediction>A</prediction> <prediction>B</prediction>", "A"),  # the first
    ],
)
def test_tagged_reads_the_first_well_formed_field(reply, expected):
    assert tagged(reply, "prediction") == expected


def test_states_match_up_to_whitespace_within_a_line_not_across_lines():
    assert normalise_state("  _  P \n\n G _\n") == "_ P\nG _"
    reply = "<observation> # P\n#_ _ </observation> <prediction>\n# _\n#P\n</prediction>"
    assert field_matches(reply, "observation", "# P\n#_ _")
    assert field_matches(reply, "prediction", "#  _\n#P")
    assert not field_matches(reply, "prediction", "# _ #P")  # two rows are not one
    assert not field_matches(reply, "prediction", "# _\n#_")  # one cell wrong
    assert not field_matches("<prediction>#P", "prediction", "#P")  # unclosed


def _turn(state: str, response: str) -> Turn:
    return Turn(state, response, "", [], [], True, 0.0, 0.0)


def test_score_counts_every_turn_against_the_state_after_it():
    right = world_model_rationale("A", "B")
    trajs = [
        Trajectory(
            "frozenlake",
            0,
            0,
            turns=[
                _turn("A", f"<think> {right} </think> <answer> Down </answer>"),  # both right
                _turn("B", "<think> <observation>B</observation> <prediction>B</prediction>"),
                _turn("C", "<answer> Up </answer>"),  # no fields at all
            ],
            final_state="D",
        ),  # fmt: skip
        # The env broke: its last state is not the env's, so the episode is left out.
        Trajectory("frozenlake", 1, 1, turns=[_turn("A", right)], error="step: ValueError"),
    ]
    assert states_after(trajs[0]) == ["B", "C", "D"]
    score = score_trajectories(trajs)
    assert (score.turns, score.observations, score.predictions) == (3, 2, 2)
    assert (score.observation_exact, score.prediction_exact) == (2, 1)
    rates = score.rates()
    assert rates["prediction_exact"] == pytest.approx(1 / 3)
    assert rates["observation_written"] == pytest.approx(2 / 3)
    assert score_trajectories([]).rates()["prediction_exact"] == 0.0


def test_the_experiment_prints_the_rates_of_an_eval_folder(tmp_path, capsys):
    traj = Trajectory(
        "frozenlake", 0, 0,
        turns=[_turn("A", f"<think> {world_model_rationale('A', 'X')} </think>")],
        final_state="B",
    )  # fmt: skip
    write_results(tmp_path / "eval", [traj], {})
    assert world_model_accuracy.main([str(tmp_path / "eval")]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[1:] == ["1", "0.0%", "100.0%", "100.0%", "100.0%"]
    assert world_model_accuracy.main([str(tmp_path / "nothing")]) == 2


# ------------------------------------------------------------------------ the command
def _sft(*argv: str) -> int:
    from starpo.cli import main

    try:
        return main(["sft", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


def test_sft_from_world_model_trains_on_world_model_turns(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "wm"
    argv = ["--model", str(tiny_model_dir), "--env", "frozenlake", "--out", str(out)]
    flags = ["--from-world-model", "4", "--max-turns", "100", "--epochs", "1", "--quiet"]
    assert _sft(*argv, *flags) == 0
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["data"]["from_world_model"] == 4 and summary["data"]["kept"] == 4
    examples = [Trajectory.from_json(line) for line in open(out / "sft_data.jsonl")]
    assert score_trajectories(examples).rates()["prediction_exact"] == 1.0
    capsys.readouterr()
    assert _sft(*argv, "--from-world-model", "4", "--no-think") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("starpo: error: world-model SFT writes the state") and "--think" in line
    assert _sft(*argv, "--from-world-model", "-1") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("starpo: error: --from-world-model must be between 0 and")
