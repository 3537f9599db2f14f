"""The one rule for equal rewards, and the step's learning-signal shares (`starpo.stats`)."""

from __future__ import annotations

import random

import pytest

from starpo.algorithms import filter_groups
from starpo.algorithms.filtering import FilterRule
from starpo.stats import group_reward_std, group_signal, rewards_equal


def test_rewards_equal_up_to_rounding_only():
    assert rewards_equal([0.8, 0.8 + 6e-8, 0.8])  # 1 float32 ulp at 0.8
    assert rewards_equal([10.0, 10.0 + 5e-6])  # relative to the magnitude
    assert rewards_equal([]) and rewards_equal([3.0])
    assert not rewards_equal([0.0, 1e-3])
    assert not rewards_equal([-0.1, 0.0])
    assert group_reward_std([0.8, 0.8 + 6e-8, 0.8]) == 0.0
    assert group_reward_std([0.0, 1.0]) == pytest.approx(0.7071067811865476)


def test_the_filter_counts_a_rounding_residue_as_no_signal():
    groups = [[0.8, 0.8 + 6e-8, 0.8], [0.0, 1.0, 0.0]]
    result = filter_groups(groups, rule=FilterRule(rule="ratio", ratio=1.0, keep_zero_std=False))
    assert result.kept == [1]
    assert result.group_std[0] == 0.0
    assert result.zero_std_groups == 0.5


def naive_signal(rewards, solved):
    """Counted one group at a time, as a person would."""
    informative = failed = all_solved = 0
    rates = []
    for group_rewards, group_solved in zip(rewards, solved, strict=True):
        informative += max(group_rewards) - min(group_rewards) > 1e-6
        wins = sum(1 for s in group_solved if s)
        failed += wins == 0
        all_solved += wins == len(group_solved)
        rates.append(wins / len(group_solved))
    n = len(rewards)
    return {
        "informative_groups": informative / n,
        "all_failed_groups": failed / n,
        "all_solved_groups": all_solved / n,
        "pass_rate": sum(rates) / n,
    }


@pytest.mark.parametrize("seed", range(10))
def test_group_signal_matches_a_naive_count(seed):
    rng = random.Random(seed)
    solved = [[rng.random() < rng.random() for _ in range(rng.randint(1, 8))] for _ in range(12)]
    rewards = [[float(s) for s in group] for group in solved]  # a binary reward
    got = group_signal(rewards, solved)
    want = naive_signal(rewards, solved)
    assert got == pytest.approx(want)
    # With a binary reward every group is exactly one of the three kinds.
    kinds = got["informative_groups"] + got["all_failed_groups"] + got["all_solved_groups"]
    assert kinds == pytest.approx(1.0)


def test_group_signal_of_a_known_step():
    solved = [[False] * 4, [True] * 4, [True, False, False, False], [True, True, False, False]]
    rewards = [[float(s) for s in g] for g in solved]
    rewards[0] = [-0.3, -0.5, -0.3, -0.3]  # a shaped reward: failed throughout, yet varies
    got = group_signal(rewards, solved)
    assert got == {
        "informative_groups": 0.75,
        "all_failed_groups": 0.25,
        "all_solved_groups": 0.25,
        "pass_rate": pytest.approx((0 + 1 + 0.25 + 0.5) / 4),
    }
    with pytest.raises(ValueError, match="3 reward groups but 4"):
        group_signal(rewards[:3], solved)
