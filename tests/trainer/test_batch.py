"""`build_batch` on hand-made trajectories: padding, masks, log-probs, reward placement;
`TrainBatch.select` and `.to`."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from starpo.compute.batch import TrainBatch, build_batch
from starpo.types import Trajectory, Turn

PAD = 99


def _turn(reward: float) -> Turn:
    return Turn(
        state="s",
        response="r",
        think="",
        actions=[],
        executed=[],
        format_ok=True,
        env_reward=reward,
        reward=reward,
    )


def _trajectories() -> list[Trajectory]:
    """Row 0: two turns (tokens 2-3 and 5), a rollout log-prob off the mask that must be
    dropped; row 1: one turn, shorter (padded by two)."""
    a = Trajectory(
        env_id="bandit",
        seed=1,
        group=0,
        turns=[_turn(1.0), _turn(-0.25)],
        token_ids=[10, 11, 12, 13, 14, 15],
        loss_mask=[0, 0, 1, 1, 0, 1],
        logprobs=[-9.0, 0.0, -0.5, -0.25, 0.0, -1.0],
        turn_ends=[3, 5],
    )
    b = Trajectory(
        env_id="bandit",
        seed=2,
        group=1,
        turns=[_turn(0.5)],
        token_ids=[20, 21, 22, 23],
        loss_mask=[0, 1, 1, 1],
        logprobs=[0.0, -0.1, -0.2, -0.3],
        turn_ends=[3],
    )
    return [a, b]


def test_build_batch_pads_right_and_masks_the_agent_tokens():
    batch = build_batch(_trajectories(), PAD, per_turn_rewards=False)
    assert len(batch) == 2
    assert batch.input_ids.dtype == torch.long
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 1, 1, 0, 0]]
    assert batch.loss_mask.dtype == torch.float32
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 0, 0]]
    # Log-probs only on agent tokens: the -9.0 on a prompt token is dropped.
    expected = torch.tensor([[0, 0, -0.5, -0.25, 0, -1.0], [0, -0.1, -0.2, -0.3, 0, 0]])
    assert torch.equal(batch.rollout_logprobs, expected)
    assert batch.group_ids.tolist() == [0, 1]  # each trajectory's env group
    assert torch.allclose(batch.scores, torch.tensor([0.75, 0.5]))
    for name in ("advantages", "returns", "old_values", "ref_logprobs", "old_logprobs"):
        assert getattr(batch, name) is None, name


def test_trajectory_reward_sits_on_the_last_agent_token():
    batch = build_batch(_trajectories(), PAD, per_turn_rewards=False)
    expected = torch.zeros(2, 6)
    expected[0, 5] = 0.75  # 1.0 - 0.25, on the last turn's end
    expected[1, 3] = 0.5
    assert torch.allclose(batch.token_rewards, expected)
    # Per-turn tensors are padded to the most turns: rewards with 0, ends with -1.
    assert torch.allclose(batch.turn_rewards, torch.tensor([[1.0, -0.25], [0.5, 0.0]]))
    assert batch.turn_ends.tolist() == [[3, 5], [3, -1]]


def test_per_turn_rewards_sit_on_each_turn_end():
    batch = build_batch(_trajectories(), PAD, per_turn_rewards=True)
    expected = torch.zeros(2, 6)
    expected[0, 3], expected[0, 5], expected[1, 3] = 1.0, -0.25, 0.5
    assert torch.allclose(batch.token_rewards, expected)


def test_every_turn_end_is_an_agent_token():
    batch = build_batch(_trajectories(), PAD, per_turn_rewards=True)
    ends = batch.turn_ends
    rows = torch.arange(len(batch)).unsqueeze(1).expand_as(ends)
    valid = ends >= 0
    assert (batch.loss_mask[rows[valid], ends[valid]] == 1).all()


def test_select_trims_to_the_longest_selected_row():
    batch = build_batch(_trajectories(), PAD, per_turn_rewards=False)
    batch.advantages = torch.arange(12, dtype=torch.float).view(2, 6)
    short = batch.select([1])
    assert len(short) == 1
    for name in ("input_ids", "attention_mask", "loss_mask", "token_rewards", "advantages"):
        assert getattr(short, name).shape == (1, 4), name  # 4 real tokens: padding dropped
    assert short.input_ids.tolist() == [[20, 21, 22, 23]]
    assert short.advantages.tolist() == [[6.0, 7.0, 8.0, 9.0]]
    assert short.turn_ends.tolist() == [[3, -1]]  # per-row tensors keep their width
    assert short.turn_rewards.shape == (1, 2)
    assert short.scores.tolist() == [0.5] and short.group_ids.tolist() == [1]
    assert short.returns is None and short.old_logprobs is None


def test_select_keeps_the_given_row_order_and_full_width():
    batch = build_batch(_trajectories(), PAD, per_turn_rewards=False)
    both = batch.select(torch.tensor([1, 0]))
    assert both.input_ids.shape == (2, 6)
    assert torch.equal(both.input_ids, batch.input_ids.flip(0))
    assert torch.equal(both.token_rewards, batch.token_rewards.flip(0))
    assert both.group_ids.tolist() == [1, 0]


def test_split_yields_consecutive_trimmed_chunks_in_order():
    batch = build_batch(_trajectories() * 2, PAD, per_turn_rewards=False)  # rows 6,4,6,4
    chunks = list(batch.split(3))
    assert [rows.tolist() for rows, _ in chunks] == [[0, 1, 2], [3]]
    assert chunks[1][1].input_ids.shape == (1, 4)  # row 3 alone: trimmed to its length
    assert torch.equal(chunks[0][1].input_ids, batch.select([0, 1, 2]).input_ids)


def test_to_moves_every_tensor_and_keeps_the_empty_fields():
    batch = build_batch(_trajectories(), PAD, per_turn_rewards=False)
    batch.old_values = torch.ones(2, 6)
    moved = batch.to(torch.device("meta"))  # a real move without a GPU
    for f in fields(TrainBatch):
        original, value = getattr(batch, f.name), getattr(moved, f.name)
        if original is None:
            assert value is None, f.name
        else:
            assert value.device.type == "meta", f.name
            assert value.shape == original.shape and value.dtype == original.dtype, f.name
    assert batch.input_ids.device.type == "cpu"  # the original is untouched
    back = batch.to(torch.device("cpu"))
    assert torch.equal(back.input_ids, batch.input_ids)


@pytest.mark.parametrize("per_turn", [False, True])
def test_a_trajectory_without_turns_gets_no_reward(per_turn):
    empty = Trajectory(
        env_id="bandit", seed=3, group=2, token_ids=[5, 6], loss_mask=[0, 0], logprobs=[0, 0]
    )
    batch = build_batch([*_trajectories(), empty], PAD, per_turn_rewards=per_turn)
    assert batch.token_rewards[2].abs().sum() == 0
    assert batch.turn_ends[2].tolist() == [-1, -1]
    assert batch.scores[2] == 0


def test_turn_states_number_equal_state_keys_alike_and_unknown_ones_minus_one():
    a, b = _trajectories()
    a.turns[0].state_key, a.turns[1].state_key = "k1", "k2"
    b.turns[0].state_key = "k1"
    c = Trajectory(env_id="bandit", seed=3, group=1, turns=[_turn(0.0)], token_ids=[1, 2],
                   loss_mask=[0, 1], logprobs=[0.0, -0.1], turn_ends=[1])  # fmt: skip
    batch = build_batch([a, b, c], PAD, per_turn_rewards=False)  # c's key "": unknown
    assert batch.turn_states.tolist() == [[0, 1], [0, -1], [-1, -1]]
    assert batch.select([2, 0]).turn_states.tolist() == [[-1, -1], [0, 1]]
