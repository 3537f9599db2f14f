"""SFT data: records replayed through the rollout engine are RL rollouts, token for token."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from starpo.envs import TextEnv
from starpo.envs.frozenlake.env import FrozenLakeEnv
from starpo.envs.sokoban.env import SokobanEnv
from starpo.errors import UserError
from starpo.evaluation.scripted import play_episodes
from starpo.evaluation.summary import write_results
from starpo.models import load_tokenizer, stop_token_ids
from starpo.rollout import EpisodeSettings, RolloutEngine
from starpo.rollout.parser import parse_turn
from starpo.sft.data import policy_records, read_records
from starpo.sft.replay import replay_records
from starpo.sft.responses import solver_turn_text
from starpo.types import Trajectory


@pytest.fixture(scope="module")
def tiny():
    from starpo.models import tiny_random_model

    return tiny_random_model(seed=0)


@pytest.fixture
def placeholder_rationale(monkeypatch):
    """Sokoban explains every move with a fixed sentence (independent of its real text)."""
    monkeypatch.setattr(SokobanEnv, "explain", lambda self, action: f"I go {action}.")


def _write(tmp_path: Path, records) -> Path:
    write_results(tmp_path, records, {})
    return tmp_path / "trajectories.jsonl"


@pytest.mark.parametrize(
    ("think", "window"), [(True, "full"), (False, "full"), (True, "last_k"), (False, "single_turn")]
)
def test_model_rollouts_replay_to_identical_tokens(tiny, tmp_path, think, window):
    """The key invariance: sampled RL rollouts, written and read back, replay to the very
    token ids and loss mask the engine recorded (in every context-window mode)."""
    from starpo.rollout.backends.hf import HFBackend

    model, tokenizer = tiny
    settings = EpisodeSettings(
        max_turns=3,
        max_new_tokens=10,
        temperature=1.0,
        think=think,
        context_window=window,
        context_turns=1,
    )
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id, seed=1)
    rollouts = RolloutEngine(backend, tokenizer, settings).run("sokoban", [10000, 10001], 2)
    assert max(len(t.turns) for t in rollouts) > 1  # multi-turn
    records = read_records([_write(tmp_path, rollouts)]).records
    result = replay_records(records, tokenizer, settings)
    assert not result.skipped
    assert len(result.examples) == len(rollouts)
    for original, replayed in zip(rollouts, result.examples, strict=True):
        assert replayed.token_ids == original.token_ids
        assert replayed.loss_mask == original.loss_mask
        assert replayed.turn_ends == original.turn_ends
        assert replayed.context_resets == original.context_resets
        assert bool(original.context_resets) == (window != "full" and len(original.turns) == 3)
        assert [t.response for t in replayed.turns] == [t.response for t in original.turns]


@pytest.mark.parametrize(
    ("think", "stop_at_answer", "per_turn"),
    [(True, True, 1), (True, False, 2), (False, True, 2), (False, False, 1)],
)
def test_solver_records_replay_with_their_actions(
    placeholder_rationale, tmp_path, think, stop_at_answer, per_turn
):
    tokenizer = load_tokenizer()
    settings = EpisodeSettings(
        max_turns=10, max_actions_per_turn=2, think=think, stop_at_answer=stop_at_answer
    )
    records = policy_records("sokoban", 6).records
    result = replay_records(records, tokenizer, settings, actions_per_turn=per_turn)
    assert not result.skipped and len(result.examples) == len(records)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn in stop_token_ids(tokenizer)
    for record, traj in zip(records, result.examples, strict=True):
        actions = [s.action for s in record.steps]
        assert [a for t in traj.turns for a in t.executed] == actions
        assert traj.success == record.success
        assert len(traj.turns) == -(-len(actions) // per_turn)
        for i, (turn, end) in enumerate(zip(traj.turns, traj.turn_ends, strict=True)):
            parsed = parse_turn(turn.response, think=think, max_actions=2)
            assert parsed.format_ok and turn.format_ok
            chunk = actions[i * per_turn : (i + 1) * per_turn]
            expected = "<think>" if think else "<answer>"
            expected += solver_turn_text(chunk, " ".join(f"I go {a}." for a in chunk), think)
            assert turn.response == expected
            last = traj.token_ids[end]
            # A generation cut at </answer> ends with its tokens; else the model ends the turn.
            assert (last == end_of_turn) != stop_at_answer
    # Written out and read back, the examples replay again to the same tokens.
    again = replay_records(
        read_records([_write(tmp_path, result.examples)]).records, tokenizer, settings
    )
    assert [t.token_ids for t in again.examples] == [t.token_ids for t in result.examples]


def test_solver_turn_text_in_think_mode(placeholder_rationale):
    """The text a solver turn replays to (after the prompt's `<think>`)."""
    assert solver_turn_text(["Up", "Left"], "I go Up. I go Left.", True) == (
        " I go Up. I go Left. </think> <answer> Up || Left </answer>"
    )
    assert solver_turn_text(["Up"], None, False) == " Up </answer>"


def test_records_without_tokens_replay_from_their_text(placeholder_rationale):
    """A record whose tokens are gone (another tokenizer, a hand-written file) replays from
    its response text; a solver-style turn tokenises back to the same ids."""
    tokenizer = load_tokenizer()
    settings = EpisodeSettings(max_turns=10)
    first = replay_records(policy_records("sokoban", 3).records, tokenizer, settings).examples
    stripped = [dataclasses.replace(t, token_ids=[], loss_mask=[], turn_ends=[]) for t in first]
    again = replay_records(stripped, tokenizer, settings)
    assert [t.token_ids for t in again.examples] == [t.token_ids for t in first]


def test_slippery_frozenlake_replays_failures_too():
    """Seeded envs slip again as recorded, so failed solver episodes replay as well."""
    records = list(play_episodes("frozenlake", "solver", 12, seed_start=100000))
    assert not all(r.success for r in records)
    settings = EpisodeSettings(max_turns=10, think=False)
    result = replay_records(records, load_tokenizer(), settings)
    assert not result.skipped
    assert [t.success for t in result.examples] == [r.success for r in records]


def test_records_that_do_not_replay_are_skipped_with_a_reason(placeholder_rationale):
    tokenizer = load_tokenizer()
    records = policy_records("sokoban", 8).records
    long = [r for r in records if len(r.steps) > 2]
    assert long
    result = replay_records(records, tokenizer, EpisodeSettings(max_turns=2))
    assert sum(result.skipped.values()) == len(long)
    assert list(result.skipped) == [
        "needs more turns than max_turns (raise --max-turns or --actions-per-turn)"
    ]
    forged = [dataclasses.replace(r, success=not r.success) for r in records[:2]]
    result = replay_records(forged, tokenizer, EpisodeSettings(max_turns=10))
    assert result.skipped == {"the outcome differs from the record": 2}
    other_level = replay_records(
        records[:2], tokenizer, EpisodeSettings(max_turns=10), env_kwargs={"dim_room": (7, 7)}
    )
    assert other_level.skipped == {"the initial state differs (another env or --env-arg?)": 2}


def test_think_without_env_rationale_is_a_user_error(monkeypatch):
    monkeypatch.setattr(FrozenLakeEnv, "explain", TextEnv.explain)
    records = policy_records("frozenlake", 2).records
    with pytest.raises(UserError, match="--no-think"):
        replay_records(records, load_tokenizer(), EpisodeSettings(think=True))


def test_actions_per_turn_above_the_parser_limit_is_a_user_error():
    records = policy_records("sokoban", 1).records
    settings = EpisodeSettings(max_actions_per_turn=1, think=False)
    with pytest.raises(UserError, match="--max-actions-per-turn"):
        replay_records(records, load_tokenizer(), settings, actions_per_turn=2)


def test_unknown_env_id_is_the_registry_error(tmp_path):
    record = Trajectory(env_id="sokobn", seed=1, group=0)
    with pytest.raises(UserError, match="sokoban"):
        replay_records([record], load_tokenizer(), EpisodeSettings(think=False))


@pytest.mark.parametrize("env_id", ["countdown", "countdown-multi", "sudoku", "qa", "2048-3x3"])
def test_free_text_and_new_envs_give_sft_examples_from_their_solver(env_id):
    """`starpo sft --from-solver` on the RAGEN-2 envs: every solver episode replays, with
    its rationale as the think text, and succeeds."""
    settings = EpisodeSettings(max_turns=100, max_actions_per_turn=1, max_actions_per_traj=100)
    records = policy_records(env_id, 4).records
    result = replay_records(records, load_tokenizer(), settings)
    assert not result.skipped and len(result.examples) == 4
    for record, traj in zip(records, result.examples, strict=True):
        assert traj.success == record.success
        assert [a for t in traj.turns for a in t.executed] == [s.action for s in record.steps]
        assert all(t.format_ok and t.think for t in traj.turns)
