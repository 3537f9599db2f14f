"""RAGEN-2's template-collapse metrics: does a reply still depend on its input?

A policy can keep the entropy of its reasoning and yet write the same kind of reply
whatever the prompt says ("template collapse"); entropy cannot see that, mutual
information between prompt and reply can. On a sample of N (prompt, reply) pairs the
trainer scores every reply under every prompt (`trainer.mi_probe`), giving an N x N matrix

    S[i][j] = log p(reply_j | prompt_i)   (nats, summed over the reply's tokens)

and the functions below turn it into numbers. The prompts are taken as uniform over the
sample (its empirical distribution), so reply j's marginal is the log-mean-exp of its
column. Pure functions of plain lists or arrays (numpy, never torch), so the detector,
the report and the tests read them without a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Metric keys: `diagnostics/mi/<sample>/<name>`, one sample per SAMPLES entry.
MI_PREFIX = "diagnostics/mi"
#: The two samples of RAGEN-2: each sampled trajectory's first turn, and one turn drawn
#: uniformly within trajectories drawn uniformly.
SAMPLES = ("first_turn", "uniform")
#: Two scores closer than this (nats) are a tie for retrieval: the same reply scored
#: under two identical prompts differs only by float rounding, far below this.
TIE_TOL = 1e-4
#: Smallest standard error the z-score divides by (nats): identical gaps on every reply
#: happen only in constructed cases, and must not divide by zero.
MIN_STANDARD_ERROR = 1e-6


def _matrix(scores: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """`scores` as a float64 (N, N) array; a ValueError for any other shape."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] != s.shape[1] or s.shape[0] == 0:
        raise ValueError(f"cross-scores must be a non-empty N x N matrix, got shape {s.shape}")
    return s


def log_mean_exp(values: Sequence[float] | np.ndarray) -> float:
    """log(mean(exp(values))), computed from the largest value (no overflow)."""
    v = np.asarray(values, dtype=np.float64)
    top = float(v.max())
    return top + math.log(float(np.mean(np.exp(v - top))))


def marginal_logps(scores) -> np.ndarray:
    """(N,) each reply j's log-prob under the sample's prompts taken as uniform:
    log-mean-exp over prompts i of S[i][j]."""
    s = _matrix(scores)
    return np.array([log_mean_exp(s[:, j]) for j in range(s.shape[1])])


def mi_gaps(scores) -> np.ndarray:
    """(N,) S[j][j] - marginal_j: how much more likely reply j is under its own prompt
    than under a prompt of the sample at random. At most log N each."""
    s = _matrix(scores)
    return np.diag(s) - marginal_logps(s)


def mi_estimate(scores) -> float:
    """The MI estimate (nats): mean over replies of `mi_gaps`. 0 for a policy that ignores
    its prompt (equal rows), log N when each reply is possible only under its own."""
    return float(np.mean(mi_gaps(scores)))


def mi_z_score(scores) -> float:
    """MI / (std_j(gap_j) / sqrt(N)), std with N - 1 degrees of freedom: the MI estimate
    in standard errors of the mean of the per-reply gaps (a one-sample t statistic).

    Why: the gaps are sums over a reply's tokens, so their scale grows with reply length
    and differs by task; in standard errors it reads the same everywhere, and below about
    2 the sample cannot tell the MI from 0. The standard error is at least
    MIN_STANDARD_ERROR; with one reply (no spread) it is 0.
    """
    gaps = mi_gaps(scores)
    if len(gaps) < 2:
        return 0.0
    error = max(float(np.std(gaps, ddof=1)) / math.sqrt(len(gaps)), MIN_STANDARD_ERROR)
    return float(np.mean(gaps)) / error


def retrieval_accuracy(scores, tol: float = TIE_TOL) -> float:
    """Share of replies that score highest under their own prompt (S[j][j] is the top of
    column j). Ties count fractionally: when k prompts are within `tol` of the top and the
    reply's own is one of them, the reply counts 1/k. So a policy that ignores its prompt
    (every column constant) scores exactly chance, 1/N, and one whose replies fit only
    their own prompt scores 1."""
    s = _matrix(scores)
    credit = 0.0
    for j in range(s.shape[1]):
        top = s[:, j].max()
        tied = s[:, j] >= top - tol
        if tied[j]:
            credit += 1.0 / int(tied.sum())
    return credit / s.shape[1]


def template_collapse_metrics(scores, prefix: str = "") -> dict[str, float]:
    """Every number of one sample, keyed `<prefix><name>`: mi, mi_z, retrieval_acc,
    chance (1/N: what retrieval_acc is for a policy that ignores its prompt),
    matched_logp (mean of S[j][j]) and marginal_logp (mean of the marginals)."""
    s = _matrix(scores)
    values = {
        "mi": mi_estimate(s),
        "mi_z": mi_z_score(s),
        "retrieval_acc": retrieval_accuracy(s),
        "chance": 1.0 / s.shape[0],
        "matched_logp": float(np.mean(np.diag(s))),
        "marginal_logp": float(np.mean(marginal_logps(s))),
    }
    return {f"{prefix}{name}": value for name, value in values.items()}


def mi_key(sample: str, name: str) -> str:
    """The metrics.jsonl key of one number of one sample, e.g. mi_key("uniform", "mi")."""
    return f"{MI_PREFIX}/{sample}/{name}"
