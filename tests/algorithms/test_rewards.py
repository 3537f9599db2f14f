"""Reward placement onto the token grid."""

from __future__ import annotations

import pytest
import torch

from starpo.algorithms import pad_turns, place_rewards


def test_per_turn_and_trajectory_placement():
    rewards = [[0.5, -0.1, 2.0], [], [1.0]]
    ends = [[2, 5, 8], [], [0]]
    per_turn = place_rewards((3, 10), rewards, ends, per_turn=True)
    expected = torch.zeros(3, 10)
    expected[0, 2], expected[0, 5], expected[0, 8], expected[2, 0] = 0.5, -0.1, 2.0, 1.0
    assert torch.equal(per_turn, expected)
    trajectory = place_rewards((3, 10), rewards, ends, per_turn=False)
    expected = torch.zeros(3, 10)
    expected[0, 8], expected[2, 0] = 0.5 - 0.1 + 2.0, 1.0
    assert torch.allclose(trajectory, expected)
    # Both modes carry the same total reward per sequence.
    assert torch.allclose(per_turn.sum(1), trajectory.sum(1))


def test_placement_rejects_mismatched_lists():
    with pytest.raises(ValueError, match="turn rewards"):
        place_rewards((1, 4), [[1.0, 2.0]], [[3]], per_turn=True)
    with pytest.raises(ValueError, match="sequences"):
        place_rewards((2, 4), [[1.0]], [[3], [2]], per_turn=True)
    with pytest.raises(ValueError, match="B=3"):
        place_rewards((3, 4), [[1.0]], [[3]], per_turn=True)


def test_pad_turns():
    rewards, ends = pad_turns([[1.0, 2.0], [], [3.0]], [[1, 4], [], [0]])
    assert rewards.tolist() == [[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]]
    assert ends.tolist() == [[1, 4], [-1, -1], [0, -1]]
    assert ends.dtype == torch.long
    rewards, ends = pad_turns([[]], [[]])
    assert rewards.shape == ends.shape == (1, 1)
    assert ends.tolist() == [[-1]]
