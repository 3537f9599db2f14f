"""Losses against plain-Python references, and the clipping behaviour token by token."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.algorithms import (
    AGGREGATIONS,
    aggregate,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    ppo_policy_loss,
    token_logprobs,
    value_loss,
)

# ---------------------------------------------------------------- naive references


def ref_aggregate(loss, mask, mode):
    rows = [
        [v for v, m in zip(lrow, mrow, strict=True) if m]
        for lrow, mrow in zip(loss, mask, strict=True)
    ]
    nonempty = [r for r in rows if r]
    if not nonempty:
        return 0.0
    if mode == "token_mean":
        return sum(sum(r) for r in nonempty) / sum(len(r) for r in nonempty)
    if mode == "seq_mean_token_mean":
        return sum(sum(r) / len(r) for r in nonempty) / len(nonempty)
    return sum(sum(r) for r in nonempty) / len(nonempty)  # seq_mean_token_sum


def ref_ppo_matrix(logp, old, adv, clip_low, clip_high, dual_clip):
    out = []
    for lrow, orow, arow in zip(logp, old, adv, strict=True):
        row = []
        for lp, o, a in zip(lrow, orow, arow, strict=True):
            ratio = math.exp(lp - o)
            clipped = min(max(ratio, 1 - clip_low), 1 + clip_high)
            loss = max(-a * ratio, -a * clipped)
            if dual_clip is not None and a < 0:
                loss = min(loss, -a * dual_clip)
            row.append(loss)
        out.append(row)
    return out


def ref_log_softmax(row, temperature=1.0):
    z = [v / temperature for v in row]
    top = max(z)
    lse = top + math.log(sum(math.exp(v - top) for v in z))
    return [v - lse for v in z]


def _random_case(seed, batch=5, length=12):
    rng = random.Random(seed)
    mask = [[rng.random() < 0.6 for _ in range(length)] for _ in range(batch)]
    mask[0] = [False] * length  # a sequence without agent tokens
    old = [[rng.uniform(-3, 0) for _ in range(length)] for _ in range(batch)]
    logp = [[o + rng.uniform(-0.5, 0.5) for o in row] for row in old]
    adv = [[rng.gauss(0, 1) for _ in range(length)] for _ in range(batch)]
    return mask, old, logp, adv


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------- aggregation


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregate_matches_reference(seed, mode):
    mask, old, _, _ = _random_case(seed)
    got = aggregate(_t(old), _t(mask), mode).item()
    assert got == pytest.approx(ref_aggregate(old, mask, mode))


def test_aggregation_modes_differ_on_unequal_lengths():
    loss = _t([[1.0, 0.0, 0.0, 0.0], [3.0, 3.0, 3.0, 9.0], [7.0, 7.0, 7.0, 7.0]])
    mask = _t([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])  # lengths 1, 3 and empty
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx((1 + 9) / 4)
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx((1 + 3) / 2)
    assert aggregate(loss, mask, "seq_mean_token_sum").item() == pytest.approx((1 + 9) / 2)


def test_aggregate_empty_mask_is_zero_and_differentiable():
    loss = torch.full((2, 3), float("nan")).requires_grad_()
    for mode in AGGREGATIONS:
        out = aggregate(loss, torch.zeros(2, 3), mode)
        assert out.item() == 0.0
        (grad,) = torch.autograd.grad(out, loss)
        assert torch.equal(grad, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        aggregate(loss, torch.zeros(2, 3), "sum")


# ---------------------------------------------------------------- PPO policy loss


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("clips", [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 3.0)])
@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_ppo_loss_matches_reference(seed, clips, agg):
    mask, old, logp, adv = _random_case(seed)
    clip_low, clip_high, dual = clips
    loss, metrics = ppo_policy_loss(
        _t(logp), _t(old), _t(adv), _t(mask), clip_low, clip_high, dual, agg
    )
    loss_mat = ref_ppo_matrix(logp, old, adv, clip_low, clip_high, dual)
    assert loss.item() == pytest.approx(ref_aggregate(loss_mat, mask, agg))
    cells = [
        (math.exp(lp - o), a)
        for lrow, orow, arow, mrow in zip(logp, old, adv, mask, strict=True)
        for lp, o, a, m in zip(lrow, orow, arow, mrow, strict=True)
        if m
    ]
    n = len(cells)
    assert metrics["pg_clipfrac"] == pytest.approx(
        sum(a > 0 and r > 1 + clip_high for r, a in cells) / n
    )
    assert metrics["pg_clipfrac_lower"] == pytest.approx(
        sum(a < 0 and r < 1 - clip_low for r, a in cells) / n
    )
    assert metrics["approx_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r, _ in cells) / n)
    assert metrics["approx_kl"] >= 0
    assert metrics["ratio_mean"] == pytest.approx(sum(r for r, _ in cells) / n)
    assert metrics["ratio_max"] == pytest.approx(max(r for r, _ in cells))
    assert ("dual_clipfrac" in metrics) == (dual is not None)


def _clip_case(ratios, advantages):
    logp = torch.log(_t(ratios))[None].requires_grad_()
    return logp, torch.zeros_like(logp), _t(advantages)[None], torch.ones_like(logp)


def test_asymmetric_clip_and_zero_gradient_exactly_where_clipped():
    ratios = [1.21, 1.29, 1.21, 1.29, 0.79, 0.81, 0.79, 1.0]
    advs = [1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0, 1.0]
    clipped = [False, True, False, False, True, False, False, False]
    logp, old, adv, mask = _clip_case(ratios, advs)
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    (grad,) = torch.autograd.grad(loss, logp)
    n = len(ratios)
    for i, (r, a, c) in enumerate(zip(ratios, advs, clipped, strict=True)):
        # token_mean: d/dlogp (-A * ratio) / n = -A * ratio / n where unclipped.
        expected = 0.0 if c else -a * r / n
        assert grad[0, i].item() == pytest.approx(expected, abs=1e-12), i
        assert (grad[0, i].item() == 0.0) == c, i
    assert metrics["pg_clipfrac"] == pytest.approx(1 / n)  # only (1.29, A > 0)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / n)  # only (0.79, A < 0)
    # A symmetric 0.2 clip would also clip (1.21, A > 0): clip-higher leaves it free.
    _, symmetric = ppo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert symmetric["pg_clipfrac"] == pytest.approx(2 / n)


def test_dual_clip_caps_the_loss_for_negative_advantages():
    ratios, advs = [5.0, 2.0, 5.0], [-1.0, -1.0, 1.0]
    logp, old, adv, mask = _clip_case(ratios, advs)
    plain, _ = ppo_policy_loss(logp, old, adv, mask, agg="seq_mean_token_sum")
    assert plain.item() == pytest.approx(5.0 + 2.0 - 1.2)
    loss, metrics = ppo_policy_loss(logp, old, adv, mask, dual_clip=3.0, agg="seq_mean_token_sum")
    assert loss.item() == pytest.approx(3.0 + 2.0 - 1.2)  # 5 capped at -A * c = 3
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0].tolist() == pytest.approx([0.0, 2.0, 0.0])
    assert metrics["dual_clipfrac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, old, adv, mask, dual_clip=1.0)


def test_ppo_loss_ignores_garbage_off_the_mask():
    logp = _t([[-1.0, float("-inf"), float("nan")]]).requires_grad_()
    old = _t([[-1.2, float("-inf"), 0.0]])
    adv, mask = _t([[0.5, 1.0, 1.0]]), _t([[1, 0, 0]])
    loss, metrics = ppo_policy_loss(logp, old, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in metrics.values())
    loss, metrics = ppo_policy_loss(logp, old, adv, torch.zeros(1, 3))
    assert loss.item() == 0.0 and metrics["ratio_max"] == 0.0


# ---------------------------------------------------------------- entropy and log-probs


@pytest.mark.parametrize("seed", range(3))
def test_entropy_matches_reference_and_is_stable(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 4, 7, generator=gen, dtype=torch.float64) * 3
    got = entropy_from_logits(logits)
    for b in range(3):
        for t in range(4):
            probs = [math.exp(v) for v in ref_log_softmax(logits[b, t].tolist())]
            expected = -sum(p * math.log(p) for p in probs if p > 0)
            assert got[b, t].item() == pytest.approx(expected, abs=1e-10)
    # Shifted, sharp float32 logits: no overflow, same entropy (softmax is shift invariant).
    sharp = (logits * 50 + 1e4).float()
    reference = entropy_from_logits((logits * 50).double()).float()
    assert torch.isfinite(entropy_from_logits(sharp)).all()
    assert torch.allclose(entropy_from_logits(sharp), reference, atol=2e-2)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_token_logprobs_match_reference(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 9, generator=gen, dtype=torch.float64) * 4
    labels = torch.randint(0, 9, (2, 5), generator=gen)
    got = token_logprobs(logits, labels, temperature)
    for b in range(2):
        for t in range(5):
            expected = ref_log_softmax(logits[b, t].tolist(), temperature)[labels[b, t]]
            assert got[b, t].item() == pytest.approx(expected, abs=1e-10)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, labels, 0.0)


# ---------------------------------------------------------------- KL


def test_kl_estimators_match_reference():
    gen = torch.Generator().manual_seed(1)
    logp = torch.randn(4, 6, generator=gen, dtype=torch.float64) - 2
    ref = logp + torch.randn(4, 6, generator=gen, dtype=torch.float64)
    k1, k2, k3 = (kl_penalty(logp, ref, name) for name in ("k1", "k2", "k3"))
    for lp, r, g1, g2, g3 in zip(
        logp.flatten().tolist(),
        ref.flatten().tolist(),
        k1.flatten(),
        k2.flatten(),
        k3.flatten(),
        strict=True,
    ):
        assert g1.item() == pytest.approx(lp - r)
        assert g2.item() == pytest.approx(0.5 * (lp - r) ** 2)
        assert g3.item() == pytest.approx(math.exp(r - lp) - (r - lp) - 1)
    assert (k1 < 0).any() and (k3 >= 0).all()
    with pytest.raises(ValueError, match="k1.*k2.*k3"):
        kl_penalty(logp, ref, "k4")


def test_k3_clamps_extreme_log_ratios():
    logp, ref = _t([[-60.0, 0.0]]), _t([[0.0, -60.0]])
    got = kl_penalty(logp, ref, "k3")
    assert got[0, 0].item() == pytest.approx(math.exp(10) - 10 - 1)
    assert got[0, 1].item() == pytest.approx(math.exp(-10) + 10 - 1)


def test_k1_and_k3_are_unbiased_kl_estimates():
    p = torch.tensor([0.5, 0.2, 0.2, 0.1], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    samples = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator())
    logp, logq = p.log()[samples][None], q.log()[samples][None]
    true_kl = float((p * (p / q).log()).sum())
    for name in ("k1", "k3"):
        assert kl_penalty(logp, logq, name).mean().item() == pytest.approx(true_kl, abs=5e-3)


@settings(max_examples=50, deadline=None)
@given(st.floats(-50, 50), st.floats(-50, 50))
def test_k3_is_non_negative(logp, ref):
    assert kl_penalty(_t([[logp]]), _t([[ref]]), "k3").item() >= 0.0


# ---------------------------------------------------------------- value loss


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("clip", [0.5, 0.1, None])
def test_value_loss_matches_reference(seed, clip):
    mask, old, new, returns = _random_case(seed)
    loss, metrics = value_loss(_t(new), _t(old), _t(returns), _t(mask), clip)
    mat, clipped = [], []
    for nrow, orow, rrow in zip(new, old, returns, strict=True):
        row = []
        for v, o, r in zip(nrow, orow, rrow, strict=True):
            vc = v if clip is None else o + min(max(v - o, -clip), clip)
            row.append(0.5 * max((v - r) ** 2, (vc - r) ** 2))
            clipped.append((vc - r) ** 2 > (v - r) ** 2)
        mat.append(row)
    assert loss.item() == pytest.approx(ref_aggregate(mat, mask, "token_mean"))
    assert metrics["vf_loss"] == pytest.approx(loss.item())
    flat_mask = [m for row in mask for m in row]
    frac = sum(c for c, m in zip(clipped, flat_mask, strict=True) if m) / sum(flat_mask)
    assert metrics["vf_clipfrac"] == pytest.approx(frac)


def test_value_clip_cuts_the_gradient_when_the_clipped_error_is_larger():
    values = _t([[1.0, 1.0]]).requires_grad_()
    old, returns, mask = _t([[0.0, 0.0]]), _t([[2.0, 0.0]]), _t([[1, 1]])
    loss, metrics = value_loss(values, old, returns, mask, clip=0.5)
    # Token 0: v_clipped = 0.5, (0.5 - 2)^2 = 2.25 > (1 - 2)^2 = 1 -> clipped term wins.
    # Token 1: (1 - 0)^2 = 1 > (0.5 - 0)^2 = 0.25 -> the unclipped term wins.
    assert loss.item() == pytest.approx((0.5 * 2.25 + 0.5 * 1.0) / 2)
    (grad,) = torch.autograd.grad(loss, values)
    assert grad[0].tolist() == pytest.approx([0.0, 0.5])
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)


def test_explained_variance():
    mask, old, new, _ = _random_case(5)
    returns, values = _t(old), _t(new)
    picked = [
        (r, v)
        for rr, vr, mr in zip(old, new, mask, strict=True)
        for r, v, m in zip(rr, vr, mr, strict=True)
        if m
    ]
    expected = 1 - statistics.variance([r - v for r, v in picked]) / statistics.variance(
        [r for r, _ in picked]
    )
    assert explained_variance(values, returns, _t(mask)) == pytest.approx(expected)
    assert explained_variance(returns, returns, _t(mask)) == pytest.approx(1.0)
    assert explained_variance(values, torch.ones_like(values), _t(mask)) == 0.0
    assert explained_variance(values, returns, torch.zeros_like(values)) == 0.0
