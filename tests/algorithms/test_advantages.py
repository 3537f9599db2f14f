"""Advantage estimators against plain-Python loop references."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    bi_level_gae,
    compute_advantages,
    gae_advantages,
    group_normalise,
    grpo_advantages,
    masked_whiten,
    pad_turns,
    place_rewards,
)

# ---------------------------------------------------------------- naive references


def ref_gae(rewards, values, mask, gamma, lam):
    """Loop over each sequence's agent tokens, last to first."""
    adv = [[0.0] * len(row) for row in mask]
    ret = [[0.0] * len(row) for row in mask]
    for b, mrow in enumerate(mask):
        steps = [t for t, m in enumerate(mrow) if m]
        next_v, next_a = 0.0, 0.0
        for t in reversed(steps):
            delta = rewards[b][t] + gamma * next_v - values[b][t]
            a = delta + gamma * lam * next_a
            adv[b][t], ret[b][t] = a, a + values[b][t]
            next_v, next_a = values[b][t], a
    return adv, ret


def ref_grpo(scores, groups, eps, norm_by_std=True):
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(scores)
    for idx in members.values():
        vals = [scores[i] for i in idx]
        if len(vals) < 2 or max(vals) == min(vals):
            continue  # advantage 0
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
        for i in idx:
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out


def ref_bi_level(turn_rewards, turn_ends, values, mask, g_turn, l_turn, g_tok, l_tok):
    adv = [[0.0] * len(row) for row in mask]
    for b, ends in enumerate(turn_ends):
        v = values[b]
        next_v, next_a = 0.0, 0.0
        for k in reversed(range(len(ends))):  # turn level
            p = ends[k]
            adv[b][p] = turn_rewards[b][k] + g_turn * next_v - v[p] + g_turn * l_turn * next_a
            next_v, next_a = v[p], adv[b][p]
        start = -1
        for p in ends:  # token level inside each turn, boundary at the turn end
            inside = [t for t in range(start + 1, p) if mask[b][t]]
            next_v, next_a = v[p], adv[b][p]
            for t in reversed(inside):
                adv[b][t] = g_tok * next_v - v[t] + g_tok * l_tok * next_a
                next_v, next_a = v[t], adv[b][t]
            start = p
    ret = [
        [a + vv if m else 0.0 for a, vv, m in zip(arow, vrow, mrow, strict=True)]
        for arow, vrow, mrow in zip(adv, values, mask, strict=True)
    ]
    return adv, ret


def _approx(got: torch.Tensor, expected) -> None:
    want = torch.tensor(expected, dtype=torch.float64)
    assert got.shape == want.shape
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-10), (got, want)


# ---------------------------------------------------------------- GAE


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 1.0)])
@pytest.mark.parametrize("per_turn", [False, True])
def test_gae_matches_reference(batch_factory, seed, gamma, lam, per_turn):
    batch = batch_factory(seed)
    mask = batch.mask_t()
    rewards = place_rewards(mask.shape, batch.turn_rewards, batch.turn_ends, per_turn)
    rewards = rewards.double()
    adv, ret = gae_advantages(rewards, batch.values_t(), mask, gamma, lam)
    ref_adv, ref_ret = ref_gae(rewards.tolist(), batch.values, batch.mask, gamma, lam)
    _approx(adv, ref_adv)
    _approx(ret, ref_ret)
    assert torch.all(adv[0] == 0) and torch.all(ret[0] == 0)  # no agent tokens


@pytest.mark.parametrize("seed", range(3))
def test_gae_with_unit_gamma_lambda_is_reward_to_go_minus_value(batch_factory, seed):
    batch = batch_factory(seed, batch=6, length=24)
    mask = batch.mask_t()
    rewards = place_rewards(mask.shape, batch.turn_rewards, batch.turn_ends, True).double()
    adv, ret = gae_advantages(rewards, batch.values_t(), mask, 1.0, 1.0)
    for b, mrow in enumerate(batch.mask):
        for t, m in enumerate(mrow):
            to_go = sum(rewards[b, t:].tolist())
            expected = to_go - batch.values[b][t] if m else 0.0
            assert adv[b, t].item() == pytest.approx(expected, abs=1e-10)
            assert ret[b, t].item() == pytest.approx(to_go if m else 0.0, abs=1e-10)


def test_gae_hand_computed_multi_turn_sequence():
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1, 1, 0]], dtype=torch.float64)
    values = torch.arange(10, dtype=torch.float64)[None] / 10  # V(t) = t / 10
    rewards = torch.zeros(1, 10, dtype=torch.float64)
    rewards[0, 3], rewards[0, 8] = 1.0, 2.0
    adv, _ = gae_advantages(rewards, values, mask, gamma=0.5, lam=1.0)
    # Backwards over t = 8, 7, 6, 3, 2 (t = 6 is "next" of t = 3, skipping 4 and 5).
    a8 = 2.0 - 0.8
    a7 = 0.5 * 0.8 - 0.7 + 0.5 * a8
    a6 = 0.5 * 0.7 - 0.6 + 0.5 * a7
    a3 = 1.0 + 0.5 * 0.6 - 0.3 + 0.5 * a6
    a2 = 0.5 * 0.3 - 0.2 + 0.5 * a3
    expected = [0, 0, a2, a3, 0, 0, a6, a7, a8, 0]
    _approx(adv[0], expected)


def test_gae_rejects_rewards_off_the_mask():
    mask = torch.tensor([[1, 1, 0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    with pytest.raises(ValueError, match="outside the mask"):
        gae_advantages(rewards, torch.zeros(1, 3), mask, 1.0, 1.0)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    a=st.floats(-3, 3),
    c=st.floats(-3, 3),
    gamma=st.floats(0, 1),
    lam=st.floats(0, 1),
)
def test_gae_is_linear_in_rewards(batch_factory, seed, a, c, gamma, lam):
    """With V = 0, A(a r1 + c r2) = a A(r1) + c A(r2); with V, A is affine: A(r, V) - A(0, V)."""
    batch = batch_factory(seed)
    mask = batch.mask_t()
    rng = torch.Generator().manual_seed(seed)
    r1 = torch.randn(mask.shape, generator=rng, dtype=torch.float64) * mask
    r2 = torch.randn(mask.shape, generator=rng, dtype=torch.float64) * mask
    values = batch.values_t()

    def adv(r, v):
        return gae_advantages(r, v, mask, gamma, lam)[0]

    zero = torch.zeros_like(values)
    combined = adv(a * r1 + c * r2, zero)
    assert torch.allclose(combined, a * adv(r1, zero) + c * adv(r2, zero), atol=1e-9)
    assert torch.allclose(adv(r1, values) - adv(zero, values), adv(r1, zero), atol=1e-9)


# ---------------------------------------------------------------- GRPO


@pytest.mark.parametrize("seed", range(5))
def test_grpo_matches_reference(seed):
    rng = random.Random(seed)
    groups = [rng.choice([3, 7, 11, 42]) for _ in range(12)]  # non-contiguous ids
    scores = [rng.choice([0.0, 1.0, rng.uniform(-1, 1)]) for _ in groups]
    mask = torch.tensor([[rng.randint(0, 1) for _ in range(6)] for _ in groups])
    mask[0] = 0
    for norm in (True, False):
        adv = grpo_advantages(
            torch.tensor(scores, dtype=torch.float64), torch.tensor(groups), mask, 1e-6, norm
        )
        expected = ref_grpo(scores, groups, 1e-6, norm)
        for b in range(len(groups)):
            row = [expected[b] if m else 0.0 for m in mask[b].tolist()]
            _approx(adv[b], row)


def test_grpo_uses_unbiased_std():
    scores = torch.tensor([0.0, 1.0, 1.0, 3.0], dtype=torch.float64)
    adv = grpo_advantages(scores, torch.zeros(4, dtype=torch.long), torch.ones(4, 1), eps=0.0)
    expected = (scores - scores.mean()) / scores.std()  # torch.std default: unbiased
    assert torch.allclose(adv[:, 0], expected)


def test_grpo_singleton_and_constant_groups_give_exact_zero():
    scores = torch.tensor([0.1, 0.1, 0.1, 5.0, 1.0, 0.0], dtype=torch.float32)
    groups = torch.tensor([0, 0, 0, 1, 2, 2])
    adv = grpo_advantages(scores, groups, torch.ones(6, 3))
    assert torch.all(adv[:4] == 0.0)  # constant group of 0.1s, singleton group
    assert not torch.isnan(adv).any()
    assert adv[4, 0].item() == pytest.approx(1 / math.sqrt(2), rel=1e-5)
    assert adv[5, 0].item() == pytest.approx(-1 / math.sqrt(2), rel=1e-5)


# ---------------------------------------------------------------- bi-level GAE


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "params", [(0.95, 1.0, 1.0, 1.0), (0.9, 0.8, 0.99, 0.95), (0.5, 0.0, 0.7, 0.0)]
)
def test_bi_level_gae_matches_reference(batch_factory, seed, params):
    batch = batch_factory(seed)
    turn_rewards, turn_ends = pad_turns(batch.turn_rewards, batch.turn_ends, torch.float64)
    adv, ret = bi_level_gae(turn_rewards, turn_ends, batch.values_t(), batch.mask_t(), *params)
    ref_adv, ref_ret = ref_bi_level(
        batch.turn_rewards, batch.turn_ends, batch.values, batch.mask, *params
    )
    _approx(adv, ref_adv)
    _approx(ret, ref_ret)


@pytest.mark.parametrize("seed", range(3))
def test_bi_level_with_unit_discounts_equals_per_turn_gae(batch_factory, seed):
    """gamma = lambda = 1 at both levels: A(t) = sum of this and later turn rewards - V(t)."""
    batch = batch_factory(seed)
    mask, values = batch.mask_t(), batch.values_t()
    turn_rewards, turn_ends = pad_turns(batch.turn_rewards, batch.turn_ends, torch.float64)
    bi_adv, bi_ret = bi_level_gae(turn_rewards, turn_ends, values, mask, 1.0, 1.0, 1.0, 1.0)
    rewards = place_rewards(mask.shape, batch.turn_rewards, batch.turn_ends, True).double()
    adv, ret = gae_advantages(rewards, values, mask, 1.0, 1.0)
    assert torch.allclose(bi_adv, adv) and torch.allclose(bi_ret, ret)


def test_bi_level_validates_turn_ends():
    mask = torch.tensor([[0, 1, 1, 0, 1, 1]])
    values, rewards = torch.zeros(1, 6), torch.ones(1, 2)
    ok = bi_level_gae(rewards, torch.tensor([[2, 5]]), values, mask)[0]
    assert ok.shape == (1, 6)
    cases = {
        "agent token": [[3, 5]],  # turn end on an observation token
        "strictly increasing": [[5, 2]],
        "no turn": [[1, 2]],  # tokens 4, 5 after the last end
        "end of each row": [[-1, 5]],
        ">= T": [[2, 6]],
    }
    for message, ends in cases.items():
        with pytest.raises(ValueError, match=message):
            bi_level_gae(rewards, torch.tensor(ends), values, mask)


# ---------------------------------------------------------------- registry


def _inputs(batch, per_turn=False) -> AdvantageInputs:
    mask = batch.mask_t()
    turn_rewards, turn_ends = pad_turns(batch.turn_rewards, batch.turn_ends, torch.float64)
    rewards = place_rewards(mask.shape, batch.turn_rewards, batch.turn_ends, per_turn)
    return AdvantageInputs(
        mask=mask,
        token_rewards=rewards.double(),
        values=batch.values_t(),
        group_ids=torch.arange(mask.shape[0]) // 2,
        turn_rewards=turn_rewards,
        turn_ends=turn_ends,
    )


def test_compute_advantages_dispatch_and_whitening(batch_factory):
    inputs = _inputs(batch_factory(11, batch=8, length=20))
    raw, ret = gae_advantages(inputs.token_rewards, inputs.values, inputs.mask, 0.9, 0.8)
    adv, ret2 = compute_advantages("gae", inputs, gamma=0.9, lam=0.8)
    assert torch.allclose(adv, masked_whiten(raw, inputs.mask)) and torch.equal(ret, ret2)
    adv, _ = compute_advantages("gae", inputs, gamma=0.9, lam=0.8, whiten=False)
    assert torch.equal(adv, raw)
    raw_bi, _ = bi_level_gae(inputs.turn_rewards, inputs.turn_ends, inputs.values, inputs.mask)
    adv, _ = compute_advantages("bi_level_gae", inputs)
    assert torch.allclose(adv, masked_whiten(raw_bi, inputs.mask))


def test_compute_advantages_grpo_scores_default_to_summed_rewards(batch_factory):
    inputs = _inputs(batch_factory(12, batch=8), per_turn=True)
    adv, ret = compute_advantages("grpo", inputs)  # whiten=True must not touch GRPO
    scores = inputs.token_rewards.sum(1)
    assert ret is None
    assert torch.equal(adv, grpo_advantages(scores, inputs.group_ids, inputs.mask))


def test_compute_advantages_errors(batch_factory):
    inputs = _inputs(batch_factory(1))
    with pytest.raises(ValueError, match="bi_level_gae.*gae.*grpo"):
        compute_advantages("ppo", inputs)
    with pytest.raises(ValueError, match="gamma_turn"):
        compute_advantages("gae", inputs, gama=0.9)
    no_critic = AdvantageInputs(mask=inputs.mask, token_rewards=inputs.token_rewards)
    for name in ("gae", "bi_level_gae"):
        with pytest.raises(ValueError, match="critic"):
            compute_advantages(name, no_critic)
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages("grpo", no_critic)
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "bi_level_gae", "gigpo"}


def _one_ulp_group() -> torch.Tensor:
    """float32 returns [0.8, 0.8 + 1 ulp, 0.8]: equal up to rounding (GiGPO's step returns)."""
    scores = torch.full((3,), 0.8, dtype=torch.float32)
    scores[1] = torch.nextafter(scores[1], torch.tensor(1.0))
    assert scores[1] != scores[0]
    return scores


def test_grpo_treats_rewards_equal_up_to_rounding_as_a_constant_group():
    adv = grpo_advantages(_one_ulp_group(), torch.zeros(3, dtype=torch.long), torch.ones(3, 2))
    # Before: [0, 0.057, 0], an ulp divided by std + eps.
    assert torch.all(adv == 0.0)


def test_group_normalise_keeps_real_small_reward_gaps():
    # Sokoban's smallest reward gap (0.1) and a gap at 1e-4 of a reward of 10 still vary.
    scores = torch.tensor([0.0, -0.1, 10.0, 10.001], dtype=torch.float32)
    adv = group_normalise(scores, torch.tensor([0, 0, 1, 1]))
    assert torch.all(adv.abs() > 0.5)


def test_constant_groups_agrees_with_the_stats_rule():
    from starpo.algorithms.advantages import constant_groups
    from starpo.stats import rewards_equal

    rng = random.Random(0)
    groups = [[0.8, 0.8 + 6e-8, 0.8], [1.0, 1.0], [0.0, 1e-3], [10.0, 10.0 + 5e-6], [-3.0]]
    groups += [[rng.choice([0.0, 0.5, 1.0]) for _ in range(4)] for _ in range(20)]
    values = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    _, inverse = torch.unique(ids, return_inverse=True)
    got = constant_groups(values, inverse, len(groups)).tolist()
    assert got == [rewards_equal(g) for g in groups]
    assert got[:5] == [True, True, False, True, True]
