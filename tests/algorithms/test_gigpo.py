"""GiGPO (episode- plus step-level group credit) against a plain-Python reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from starpo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    compute_advantages,
    gigpo_advantages,
    grpo_advantages,
    pad_turns,
    recurring_turn_share,
)
from starpo.algorithms.advantages import discounted_turn_returns, spread_over_turns

# ---------------------------------------------------------------- naive reference


def ref_normalise(values: dict, eps: float, norm_by_std: bool) -> dict:
    """{key: [(member, value), ...]} -> {member: normalised value}; constant groups -> 0."""
    out = {}
    for members in values.values():
        vals = [v for _, v in members]
        if len(vals) < 2 or max(vals) == min(vals):
            out.update({m: 0.0 for m, _ in members})
            continue
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for m, v in members:
            out[m] = (v - mean) / (std + eps) if norm_by_std else v - mean
    return out


def ref_gigpo(episodes, gamma, weight, eps=1e-6, norm_by_std=True):
    """episodes: [(group, [(state or None, reward), ...])] -> per-turn advantages [[A]]."""
    by_group: dict = {}
    for i, (group, turns) in enumerate(episodes):
        by_group.setdefault(group, []).append((i, sum(r for _, r in turns)))
    episode_adv = ref_normalise(by_group, eps, norm_by_std)
    anchors: dict = {}
    for i, (group, turns) in enumerate(episodes):
        for k, (state, _) in enumerate(turns):
            ret = sum(gamma ** (j - k) * r for j, (_, r) in enumerate(turns) if j >= k)
            key = (group, state) if state is not None else ("alone", i, k)
            anchors.setdefault(key, []).append(((i, k), ret))
    step_adv = ref_normalise(anchors, eps, norm_by_std)
    return [
        [episode_adv[i] + weight * step_adv[(i, k)] for k in range(len(turns))]
        for i, (_, turns) in enumerate(episodes)
    ]


def layout(episodes, rng):
    """Token grid for the episodes: a prompt, then each turn's 1-3 agent tokens after 1-2
    observation tokens. -> mask (B, T), turn ends [[p_k]], token owner [[turn k or None]]."""
    rows = []
    for _, turns in episodes:
        mask, ends, owner = [0] * rng.randint(1, 3), [], []
        owner = [None] * len(mask)
        for k in range(len(turns)):
            n = rng.randint(1, 3)
            mask += [1] * n
            owner += [k] * n
            ends.append(len(mask) - 1)
            obs = rng.randint(1, 2)
            mask += [0] * obs
            owner += [None] * obs
        rows.append((mask, ends, owner))
    width = max(len(m) for m, _, _ in rows) + 2
    masks = [m + [0] * (width - len(m)) for m, _, _ in rows]
    owners = [o + [None] * (width - len(o)) for _, _, o in rows]
    return masks, [e for _, e, _ in rows], owners


def as_tensors(episodes, masks, ends):
    states: dict = {}
    rewards = [[r for _, r in turns] for _, turns in episodes]
    turn_rewards, turn_ends = pad_turns(rewards, ends, dtype=torch.float64)
    turn_states = torch.full_like(turn_ends, -1)
    for b, (_, turns) in enumerate(episodes):
        for k, (state, _) in enumerate(turns):
            if state is not None:
                turn_states[b, k] = states.setdefault(state, len(states))
    return dict(
        scores=torch.tensor([sum(r) for r in rewards], dtype=torch.float64),
        group_ids=torch.tensor([g for g, _ in episodes]),
        turn_rewards=turn_rewards,
        turn_ends=turn_ends,
        turn_states=turn_states,
        mask=torch.tensor(masks, dtype=torch.float64),
    )


def expected_tokens(per_turn, owners, masks):
    return torch.tensor(
        [
            [per_turn[b][k] if m and k is not None else 0.0 for k, m in zip(o, mk, strict=True)]
            for b, (o, mk) in enumerate(zip(owners, masks, strict=True))
        ],
        dtype=torch.float64,
    )


def random_episodes(rng: random.Random, groups: int = 3, size: int = 4):
    """Groups whose rollouts revisit a few states (some states unknown = None), rewards from
    Sokoban's set, several actions a turn summing into one turn reward."""
    episodes = []
    for g in range(groups):
        for _ in range(size):
            turns = []
            for _ in range(rng.randint(1, 5)):
                state = rng.choice(["s0", "s1", "s2", "s3", None])
                actions = rng.randint(1, 3)
                reward = sum(rng.choice([-0.1, -0.1, 0.9, -1.1, 10.0]) for _ in range(actions))
                turns.append((state, round(reward, 4)))
            episodes.append((g, turns))
    return episodes


# ------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_gigpo_matches_reference(seed, norm_by_std):
    rng = random.Random(seed)
    episodes = random_episodes(rng)
    masks, ends, owners = layout(episodes, rng)
    gamma, weight = rng.choice([0.95, 1.0, 0.5]), rng.choice([1.0, 0.5, 2.0])
    adv = gigpo_advantages(
        **as_tensors(episodes, masks, ends),
        gamma_step=gamma,
        step_weight=weight,
        norm_by_std=norm_by_std,
    )
    expected = expected_tokens(ref_gigpo(episodes, gamma, weight, 1e-6, norm_by_std), owners, masks)
    torch.testing.assert_close(adv, expected, rtol=1e-9, atol=1e-9)


def test_recurring_states_are_credited_by_their_return_from_there():
    # One group of two: both start in A and both reach B; from B one pushes to the goal.
    episodes = [(0, [("A", -0.1), ("B", 10.0)]), (0, [("A", -0.1), ("B", -0.1)])]
    masks, ends, owners = layout(episodes, random.Random(0))
    adv = gigpo_advantages(**as_tensors(episodes, masks, ends), gamma_step=0.95)
    per_turn = ref_gigpo(episodes, 0.95, 1.0)
    # Episode level: +-0.707 (two members). Step level, at A: returns -0.1 + 0.95 * 10 vs
    # -0.1 - 0.95 * 0.1; at B: 10 vs -0.1; again +-0.707 each. Every turn of the good
    # trajectory gets +1.414, every turn of the other -1.414.
    assert per_turn == [pytest.approx([1.41421] * 2, abs=1e-4)] + [
        pytest.approx([-1.41421] * 2, abs=1e-4)
    ]
    torch.testing.assert_close(adv, expected_tokens(per_turn, owners, masks))


def test_singleton_anchor_groups_and_unknown_states_get_only_the_episode_level():
    episodes = [(0, [("A", 1.0), ("C", 0.0)]), (0, [("B", 0.0), (None, 0.0)])]
    masks, ends, owners = layout(episodes, random.Random(1))
    tensors = as_tensors(episodes, masks, ends)
    adv = gigpo_advantages(**tensors)
    grpo = grpo_advantages(tensors["scores"], tensors["group_ids"], tensors["mask"])
    torch.testing.assert_close(adv, grpo)  # no state recurs: GiGPO is GRPO


def test_same_state_in_different_groups_is_not_an_anchor():
    episodes = [(0, [("A", 1.0)]), (0, [("B", 0.0)]), (1, [("A", 0.0)]), (1, [("B", 1.0)])]
    masks, ends, _ = layout(episodes, random.Random(2))
    tensors = as_tensors(episodes, masks, ends)
    grpo = grpo_advantages(tensors["scores"], tensors["group_ids"], tensors["mask"])
    torch.testing.assert_close(gigpo_advantages(**tensors), grpo)
    assert recurring_turn_share(
        tensors["group_ids"], tensors["turn_states"], tensors["turn_ends"]
    ) == pytest.approx(0.0)


def test_all_equal_returns_give_exact_zero():
    episodes = [(0, [("A", -0.1), ("B", -0.1)])] * 3
    masks, ends, _ = layout(episodes, random.Random(3))
    adv = gigpo_advantages(**as_tensors(episodes, masks, ends))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_step_weight_zero_is_grpo():
    rng = random.Random(4)
    episodes = random_episodes(rng)
    masks, ends, _ = layout(episodes, rng)
    tensors = as_tensors(episodes, masks, ends)
    grpo = grpo_advantages(tensors["scores"], tensors["group_ids"], tensors["mask"])
    torch.testing.assert_close(gigpo_advantages(**tensors, step_weight=0.0), grpo)


def test_discounted_turn_returns():
    rewards = torch.tensor([[1.0, 2.0, 4.0], [3.0, 0.0, 0.0]])
    ends = torch.tensor([[2, 5, 9], [4, -1, -1]])
    expected = torch.tensor([[1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4.0], [3.0, 0.0, 0.0]])
    torch.testing.assert_close(discounted_turn_returns(rewards, ends, 0.5), expected)


def test_spread_over_turns_covers_each_turns_tokens_only():
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 1, 0, 0, 0]], dtype=torch.float)
    ends = torch.tensor([[2, 4], [2, -1]])
    values = torch.tensor([[5.0, 7.0], [3.0, 0.0]])
    expected = torch.tensor([[0, 5, 5, 0, 7, 0], [0, 0, 3, 0, 0, 0]], dtype=torch.float)
    assert torch.equal(spread_over_turns(values, ends, mask), expected)


def test_recurring_turn_share_counts_turns_in_anchor_groups_of_two_or_more():
    episodes = [(0, [("A", 0.0), ("B", 0.0)]), (0, [("A", 0.0), ("C", 0.0)]), (1, [(None, 0.0)])]
    masks, ends, _ = layout(episodes, random.Random(5))
    t = as_tensors(episodes, masks, ends)
    assert recurring_turn_share(t["group_ids"], t["turn_states"], t["turn_ends"]) == 0.4


def test_registered_without_a_critic_and_run_by_name():
    assert "gigpo" in ADVANTAGE_ESTIMATORS
    assert ADVANTAGE_ESTIMATORS.info("gigpo") == {
        "critic": False,
        "groups": True,
        "rewards": "per_turn",
    }
    rng = random.Random(6)
    episodes = random_episodes(rng)
    masks, ends, _ = layout(episodes, rng)
    t = as_tensors(episodes, masks, ends)
    inputs = AdvantageInputs(
        mask=t["mask"],
        group_ids=t["group_ids"],
        turn_rewards=t["turn_rewards"],
        turn_ends=t["turn_ends"],
        turn_states=t["turn_states"],
    )
    adv, returns = compute_advantages("gigpo", inputs, gamma_step=0.9, whiten=True)
    assert returns is None  # no critic
    torch.testing.assert_close(adv, gigpo_advantages(**t, gamma_step=0.9))  # not whitened
    with pytest.raises(ValueError, match="'gigpo' needs inputs.turn_states"):
        compute_advantages("gigpo", AdvantageInputs(**{**inputs.__dict__, "turn_states": None}))
