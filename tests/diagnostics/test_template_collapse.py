"""RAGEN-2's template-collapse metrics on constructed cross-score matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from starpo.diagnostics.template_collapse import (
    marginal_logps,
    mi_estimate,
    mi_gaps,
    mi_key,
    mi_z_score,
    retrieval_accuracy,
    template_collapse_metrics,
)


def copying_scores(n: int, own: float = -1.0, other: float = -30.0) -> np.ndarray:
    """Replies that copy their prompt: likely under it, nearly impossible under others."""
    return np.full((n, n), other) + np.eye(n) * (own - other)


def ignoring_scores(n: int, seed: int = 0) -> np.ndarray:
    """A policy that ignores its prompt: each reply scores the same under every prompt
    (every row equal), whatever the reply."""
    column = np.random.default_rng(seed).normal(-20.0, 5.0, n)
    return np.tile(column, (n, 1))


@pytest.mark.parametrize("n", [2, 5, 8])
def test_replies_that_copy_their_prompt_are_all_retrieved_and_reach_log_n(n):
    scores = copying_scores(n)
    assert retrieval_accuracy(scores) == 1.0
    assert mi_estimate(scores) == pytest.approx(math.log(n), abs=1e-9)
    assert mi_z_score(scores) > 1e3  # every gap is log n: no spread at all


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_a_policy_that_ignores_its_prompt_is_at_chance_with_zero_mi(n):
    scores = ignoring_scores(n)
    assert retrieval_accuracy(scores) == 1.0 / n  # exactly: every reply ties n ways
    assert mi_estimate(scores) == pytest.approx(0.0, abs=1e-12)
    assert mi_z_score(scores) == pytest.approx(0.0, abs=1e-3)
    metrics = template_collapse_metrics(scores)
    assert metrics["retrieval_acc"] == metrics["chance"] == 1.0 / n


def test_two_by_two_by_hand():
    scores = [[-1.0, -4.0], [-3.0, -2.5]]  # S[i][j]: reply j under prompt i
    marginal = [
        math.log((math.exp(-1) + math.exp(-3)) / 2),
        math.log((math.exp(-4) + math.exp(-2.5)) / 2),
    ]
    assert marginal_logps(scores) == pytest.approx(marginal)
    gaps = [-1.0 - marginal[0], -2.5 - marginal[1]]
    assert mi_gaps(scores) == pytest.approx(gaps)
    mi = sum(gaps) / 2
    spread = abs(gaps[0] - gaps[1]) / math.sqrt(2)  # std with one degree of freedom
    metrics = template_collapse_metrics(scores, prefix="p/")
    assert metrics == pytest.approx(
        {
            "p/mi": mi,
            "p/mi_z": mi / (spread / math.sqrt(2)),
            "p/retrieval_acc": 1.0,
            "p/chance": 0.5,
            "p/matched_logp": -1.75,
            "p/marginal_logp": sum(marginal) / 2,
        }
    )


def test_ties_count_fractionally():
    scores = np.array(
        [
            [0.0, -5.0, -1.0],  # reply 0: its own prompt ties with prompt 1 -> 1/2
            [0.0, -1.0, -1.0],  # reply 1: prompt 1 alone is the top -> 1
            [-9.0, -2.0, -1.0],  # reply 2: all three tie -> 1/3
        ]
    )
    assert retrieval_accuracy(scores) == pytest.approx((0.5 + 1.0 + 1 / 3) / 3)
    # A score within the tie tolerance is a tie; one clearly below is not.
    assert retrieval_accuracy([[0.0, -1.0], [-1e-6, 0.0]]) == pytest.approx((0.5 + 1.0) / 2)
    assert retrieval_accuracy([[0.0, -1.0], [-1e-6, 0.0]], tol=0.0) == 1.0


def test_a_reply_retrieved_by_another_prompt_counts_zero():
    scores = [[-1.0, -3.0], [-0.5, -1.0]]  # reply 0 fits prompt 1 better than its own
    assert retrieval_accuracy(scores) == 0.5
    assert mi_gaps(scores)[0] < 0


def test_large_scores_do_not_overflow():
    scores = copying_scores(4, own=-2000.0, other=-5000.0)
    assert mi_estimate(scores) == pytest.approx(math.log(4))
    assert np.isfinite(marginal_logps(scores)).all()


def test_shape_is_checked_and_keys_are_named():
    with pytest.raises(ValueError, match="N x N"):
        retrieval_accuracy([[0.0, 1.0]])
    assert mi_key("uniform", "retrieval_acc") == "diagnostics/mi/uniform/retrieval_acc"
    assert set(template_collapse_metrics(copying_scores(3), mi_key("first_turn", ""))) == {
        mi_key("first_turn", name)
        for name in ("mi", "mi_z", "retrieval_acc", "chance", "matched_logp", "marginal_logp")
    }
