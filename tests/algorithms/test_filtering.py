"""StarPO-S group filtering against a plain-Python reference."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.algorithms import FILTER_MODES, filter_groups, num_kept
from starpo.algorithms.filtering import (
    FilterRule,
    choose_groups,
    group_weights,
    highest_std_first,
    loss_scale,
    score_shares,
)


def ref_std(rewards):
    return statistics.stdev(rewards) if len(rewards) > 1 else 0.0


def ref_filter(groups, ratio, mode):
    stds = [ref_std(g) for g in groups]
    keep = max(1, math.floor(ratio * len(groups) + 0.5 + 1e-9))
    sign = -1 if mode == "top_std" else 1
    order = sorted(range(len(groups)), key=lambda g: (sign * stds[g], g))
    return sorted(order[:keep]), stds


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("mode", sorted(FILTER_MODES))
def test_filter_matches_reference(seed, ratio, mode):
    rng = random.Random(seed)
    groups = [[rng.choice([0.0, 1.0, rng.uniform(-1, 1)]) for _ in range(6)] for _ in range(8)]
    result = filter_groups(groups, ratio, mode)
    kept, stds = ref_filter(groups, ratio, mode)
    assert result.kept == kept
    assert result.group_std == pytest.approx(stds)
    assert result.std_all == pytest.approx(statistics.fmean(stds))
    assert result.std_kept == pytest.approx(statistics.fmean(stds[g] for g in kept))
    assert filter_groups(torch.tensor(groups, dtype=torch.float64), ratio, mode) == result
    from_float32 = filter_groups(torch.tensor(groups), ratio, mode)
    assert from_float32.group_std == pytest.approx(stds, rel=1e-5)


def test_top_and_bottom_pick_the_extreme_groups():
    groups = [
        [1.0, 1.0, 1.0, 1.0],  # std 0
        [0.0, 10.0, 0.0, 10.0],  # largest std
        [0.0, 1.0, 0.0, 1.0],
        [0.0, 0.0, 0.0, 3.0],
    ]
    top = filter_groups(groups, 0.5, "top_std")
    assert top.kept == [1, 3]
    assert top.std_kept == pytest.approx((ref_std(groups[1]) + ref_std(groups[3])) / 2)
    assert top.std_kept > top.std_all
    bottom = filter_groups(groups, 0.5, "bottom_std")
    assert bottom.kept == [0, 2]
    assert bottom.std_kept < bottom.std_all
    assert filter_groups(groups, 1.0).kept == [0, 1, 2, 3]


def test_ties_go_to_the_lower_group_index_even_when_rewards_are_permuted():
    groups = [[0.0, 0.0], [0.1, 0.7, 0.2], [0.7, 0.2, 0.1], [0.2, 0.1, 0.7], [0.0, 0.0]]
    assert len({filter_groups(groups, 1.0).group_std[g] for g in (1, 2, 3)}) == 1
    assert filter_groups(groups, 0.4, "top_std").kept == [1, 2]
    assert filter_groups(groups, 0.2, "bottom_std").kept == [0]
    assert filter_groups(groups, 0.4, "bottom_std").kept == [0, 4]


def test_kept_count_rounds_half_up_with_at_least_one():
    assert num_kept(8, 0.25) == 2
    assert num_kept(6, 0.25) == 2  # 1.5 rounds up (RAGEN's int() would give 1)
    assert num_kept(10, 0.35) == 4  # 3.4999999999999996 in floats
    assert num_kept(3, 0.1) == 1
    assert num_kept(8, 1.0) == 8


def test_filter_validation():
    groups = [[0.0, 1.0], [1.0, 1.0]]
    for ratio in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            filter_groups(groups, ratio)
    with pytest.raises(ValueError, match="bottom_std.*top_std"):
        filter_groups(groups, 0.5, "random")
    with pytest.raises(ValueError, match="at least one"):
        filter_groups([], 0.5)
    with pytest.raises(ValueError, match="at least one"):
        filter_groups([[1.0], []], 0.5)
    with pytest.raises(ValueError, match=r"\(G, N\)"):
        filter_groups(torch.zeros(4), 0.5)
    assert filter_groups([[3.0], [1.0, 2.0]], 1.0).group_std == pytest.approx([0.0, 0.5**0.5])


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.sampled_from([0.0, 1.0, -0.1, 10.0]), min_size=1, max_size=5),
        min_size=1,
        max_size=12,
    ),
    ratio=st.floats(0.01, 1.0),
    mode=st.sampled_from(sorted(FILTER_MODES)),
)
def test_filter_properties(groups, ratio, mode):
    result = filter_groups(groups, ratio, mode)
    assert len(result.kept) == num_kept(len(groups), ratio)
    assert result.kept == sorted(set(result.kept))
    assert all(0 <= g < len(groups) for g in result.kept)
    dropped = [g for g in range(len(groups)) if g not in result.kept]
    kept_std = [result.group_std[g] for g in result.kept]
    dropped_std = [result.group_std[g] for g in dropped]
    if dropped:
        if mode == "top_std":
            assert min(kept_std) >= max(dropped_std)
        else:
            assert max(kept_std) <= min(dropped_std)


def test_config_and_filter_agree_on_the_number_of_kept_groups():
    from starpo.config import load_config

    for groups in range(1, 17):
        for ratio in (0.1, 0.25, 0.35, 0.5, 0.75, 1.0):
            cfg = load_config(
                None,
                [
                    f"rollout.num_groups={groups}",
                    "rollout.group_size=2",
                    "filter.enabled=true",
                    f"filter.ratio={ratio}",
                    "optim.mini_batch_size=2",
                    "optim.micro_batch_size=1",
                ],
            )
            assert cfg.groups_kept_per_step == num_kept(groups, ratio)


# ---- RAGEN-2's rules, against hand-computed cases -------------------------------------------

#: Four groups whose reward stds are exactly 4, 3, 2 and 1 (two rewards each: std = |a-b|/sqrt 2).
STDS = [4.0, 3.0, 2.0, 1.0]
TWO_REWARDS = [[0.0, s * math.sqrt(2)] for s in STDS]


def _kept(rule: FilterRule, groups=TWO_REWARDS) -> list[int]:
    return filter_groups(groups, rule=rule).kept


def test_top_k_keeps_the_k_largest_or_smallest():
    assert _kept(FilterRule(rule="top_k", top_k=2)) == [0, 1]
    assert _kept(FilterRule(rule="top_k", top_k=2, mode="bottom_std")) == [2, 3]
    assert _kept(FilterRule(rule="top_k", top_k=9)) == [0, 1, 2, 3]  # at most every group


def test_top_p_linear_keeps_the_fewest_groups_reaching_the_share():
    # shares of the total 10: 0.4, 0.3, 0.2, 0.1 -> cumulative 0.4, 0.7, 0.9, 1.0
    assert _kept(FilterRule(rule="top_p", top_p=0.4)) == [0]
    assert _kept(FilterRule(rule="top_p", top_p=0.5)) == [0, 1]
    assert _kept(FilterRule(rule="top_p", top_p=0.7)) == [0, 1]  # reached exactly
    assert _kept(FilterRule(rule="top_p", top_p=0.9)) == [0, 1, 2]
    assert _kept(FilterRule(rule="top_p", top_p=1.0)) == [0, 1, 2, 3]
    # variance: 16, 9, 4, 1 of 30 -> cumulative 0.533, 0.833, 0.967, 1.0
    assert _kept(FilterRule(rule="top_p", top_p=0.8, metric="variance")) == [0, 1]
    assert _kept(FilterRule(rule="top_p", top_p=0.9, metric="variance")) == [0, 1, 2]


def test_top_p_one_keeps_every_group_as_ragen2s_no_filter_baseline():
    # Linear shares of [1.41, 0.71, 0, 0] reach 1 after two groups; p = 1 keeps all four,
    # and without keep_zero_std the two whose rewards varied.
    stds = [1.41, 0.71, 0.0, 0.0]
    assert choose_groups(stds, FilterRule(rule="top_p", top_p=1.0)) == [0, 1, 2, 3]
    no_zero = FilterRule(rule="top_p", top_p=1.0, keep_zero_std=False)
    assert choose_groups(stds, no_zero) == [0, 1]
    assert choose_groups(stds, FilterRule(rule="top_p", top_p=0.9)) == [0, 1]


def test_top_p_softmax_shares():
    # softmax(4, 3, 2, 1) = 0.644, 0.237, 0.087, 0.032 -> cumulative 0.644, 0.881, 0.968
    assert _kept(FilterRule(rule="top_p", top_p=0.6, shares="softmax")) == [0]
    assert _kept(FilterRule(rule="top_p", top_p=0.85, shares="softmax")) == [0, 1]
    assert _kept(FilterRule(rule="top_p", top_p=0.95, shares="softmax")) == [0, 1, 2]
    assert score_shares([4.0, 3.0, 2.0, 1.0], "softmax") == pytest.approx(
        [math.exp(-k) / sum(math.exp(-j) for j in range(4)) for k in range(4)]
    )


def test_min_p_keeps_groups_within_a_share_of_the_best():
    assert _kept(FilterRule(rule="min_p", min_p=0.75)) == [0, 1]  # 3 >= 0.75 x 4
    assert _kept(FilterRule(rule="min_p", min_p=0.76)) == [0]
    assert _kept(FilterRule(rule="min_p", min_p=0.5)) == [0, 1, 2]
    assert _kept(FilterRule(rule="min_p", min_p=0.5, metric="variance")) == [0, 1]  # 9 >= 8
    assert _kept(FilterRule(rule="min_p", min_p=0.0)) == [0, 1, 2, 3]


def test_zero_std_groups_are_kept_only_when_allowed():
    groups = [[1.0, 1.0], [0.0, 2.0], [3.0, 3.0], [0.0, 1.0]]  # stds 0, 1.41, 0, 0.71
    assert _kept(FilterRule(rule="ratio", ratio=1.0), groups) == [0, 1, 2, 3]
    assert _kept(FilterRule(rule="ratio", ratio=1.0, keep_zero_std=False), groups) == [1, 3]
    assert _kept(FilterRule(rule="top_k", top_k=3, keep_zero_std=False), groups) == [1, 3]
    flat = [[1.0, 1.0], [2.0, 2.0]]
    assert _kept(FilterRule(rule="top_p", top_p=1.0), flat) == [0, 1]  # equal shares of 0
    assert _kept(FilterRule(rule="top_p", top_p=0.5), flat) == [0]
    empty = filter_groups(flat, rule=FilterRule(rule="top_p", keep_zero_std=False))
    assert empty.kept == [] and empty.std_kept == 0.0


def test_soft_weights_and_loss_scale():
    assert group_weights([4.0, 3.0, 0.0, 1.0]) == [1.0, 0.75, 0.0, 0.25]
    assert group_weights([0.0, 0.0]) == [1.0, 1.0]  # nothing varies: nothing to weigh by
    assert loss_scale(0.25, "none") == 1.0
    assert loss_scale(0.25, "linear") == 0.25
    assert loss_scale(0.25, "sqrt") == 0.5
    with pytest.raises(ValueError, match="loss scale"):
        loss_scale(0.5, "cube")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rule": "top_q"}, "rule must be one of"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"top_k": 0}, "top_k must be >= 1"),
        ({"rule": "min_p", "mode": "bottom_std"}, "keeps the largest scores"),
        ({"shares": "cubic"}, "linear or softmax"),
    ],
)
def test_a_bad_rule_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        FilterRule(**fields)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=4), min_size=1),
    st.sampled_from(["top_p", "min_p"]),
    st.floats(0.05, 1.0),
)
def test_adaptive_rules_keep_a_best_first_prefix(groups, rule, value):
    """Whatever the rewards: what top_p / min_p keep is the first groups of the std ranking
    (no group kept above one of larger std), at least one."""
    result = filter_groups(groups, rule=FilterRule(rule=rule, top_p=value, min_p=value))
    order = highest_std_first(result.group_std)
    assert result.kept == sorted(order[: len(result.kept)]) and result.kept
