"""Losses of the StarPO update: PPO clipped surrogate, value loss, KL penalty, entropy.

Every loss is first a per-token matrix `loss_mat` (B, T); `aggregate` then reduces it over
the agent tokens (`mask`, (B, T)) with one of the AGGREGATIONS. Metrics are python floats,
computed without gradient, with the names the trainer logs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from starpo.algorithms.masked import masked_mean, masked_sum, masked_var
from starpo.registry import KL_ESTIMATORS
from starpo.registry import LOSS_AGGREGATIONS as AGGREGATIONS

# Log-ratios beyond these bounds are clamped before exp: exp(20) ~ 5e8 is already far
# outside any trust region, and the clamp keeps a stale or garbage log-prob from turning
# the loss into inf.
MAX_LOG_RATIO = 20.0
# k3's bound on ref - logprobs before exp (as in verl's low_var_kl).
K3_LOG_RATIO_CLAMP = 10.0


def _token_sum(loss_mat: Tensor, mask: Tensor) -> Tensor:
    return masked_sum(loss_mat, mask)


def _seq_token_means(loss_mat: Tensor, mask: Tensor) -> Tensor:
    # Sequences without agent tokens contribute 0 here and are not counted below, so they
    # are left out of the mean rather than averaged in as zeros.
    return masked_mean(loss_mat, mask, dim=1).sum()


def _seq_token_sums(loss_mat: Tensor, mask: Tensor) -> Tensor:
    return masked_sum(loss_mat, mask, dim=1).sum()


def _token_count(mask: Tensor) -> Tensor:
    return mask.bool().sum()


def _nonempty_seq_count(mask: Tensor) -> Tensor:
    return mask.bool().any(dim=1).sum()


# Each aggregation is a sum over the batch divided by a count of the batch: (numerator,
# count). Splitting them is what makes micro-batching exact: each micro-batch divides its
# own sum by the count of the whole mini-batch, so the micro-batch losses add up to the
# mini-batch loss however the rows are split. Registered in starpo.registry.LOSS_AGGREGATIONS.
Aggregation = tuple[Callable[[Tensor, Tensor], Tensor], Callable[[Tensor], Tensor]]
TOKEN_MEAN: Aggregation = (_token_sum, _token_count)
SEQ_MEAN_TOKEN_MEAN: Aggregation = (_seq_token_means, _nonempty_seq_count)
SEQ_MEAN_TOKEN_SUM: Aggregation = (_seq_token_sums, _nonempty_seq_count)


def aggregation_count(mask: Tensor, mode: str = "token_mean") -> float:
    """The denominator of `aggregate` for this mask: its agent tokens (token_mean) or its
    sequences with at least one agent token (seq_* modes). Compute it over a mini-batch and
    pass it as `count` to every micro-batch's `aggregate`."""
    return float(AGGREGATIONS[mode][1](mask))


def aggregate(
    loss_mat: Tensor, mask: Tensor, mode: str = "token_mean", count: float | None = None
) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar over the agent tokens.

    token_mean:          sum_{b,t} m l / N_tok              (every token weighs the same)
    seq_mean_token_mean: sum_b [ sum_t m l / sum_t m ] / N_seq  (every sequence the same)
    seq_mean_token_sum:  sum_b [ sum_t m l ] / N_seq           (long sequences weigh more)
    N_tok / N_seq: `count` when given (the agent tokens / non-empty sequences of the whole
    mini-batch, see `aggregation_count`), else this batch's own; N = 0 gives 0, not NaN.
    With `count` from the mini-batch, the losses of its micro-batches sum to its loss.
    """
    numerator, counter = AGGREGATIONS[mode]
    total = counter(mask) if count is None else torch.as_tensor(count)
    return numerator(loss_mat, mask) / total.clamp(min=1).to(loss_mat.dtype)


def _frac(condition: Tensor, mask: Tensor) -> float:
    return float(masked_mean(condition.to(torch.float32), mask))


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: str = "token_mean",
    count: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric ("clip-higher") and optional dual clipping.

        ratio    = exp(logprobs - old_logprobs)      (log-ratio clamped to +-MAX_LOG_RATIO)
        pg_loss1 = -A * ratio
        pg_loss2 = -A * clamp(ratio, 1 - clip_low, 1 + clip_high)
        loss_mat = max(pg_loss1, pg_loss2)
        dual clip (Ye et al. 2020), c = dual_clip > 1:  loss_mat = min(loss_mat, -A * c) if A < 0
        importance weights w (B, T), optional:          loss_mat = w * loss_mat
    `w` corrects for rollouts sampled by a policy other than the one that gave
    `old_logprobs` (truncated importance sampling, see `truncated_is_weights`); it carries
    no gradient. `agg` and `count` reduce loss_mat as in `aggregate`.
    Metrics: pg_loss; pg_clipfrac (A > 0, ratio > 1 + clip_high); pg_clipfrac_lower (A < 0,
    ratio < 1 - clip_low); dual_clipfrac (A < 0 and the cap is active); approx_kl, the k3
    estimate mean((ratio - 1) - log ratio) of KL(old || new), >= 0; ratio_mean; ratio_max.
    All fractions and means are over masked tokens (0 for an empty mask).
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low/clip_high must be >= 0, got {clip_low}, {clip_high}")
    m = mask.bool()  # (B, T)
    log_ratio = torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # (B, T)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(pg_loss1, pg_loss2)  # (B, T)
    metrics: dict[str, float] = {}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (typically 3), got {dual_clip}")
        cap = -advantages * dual_clip
        negative = advantages < 0
        metrics["dual_clipfrac"] = _frac(negative & (loss_mat.detach() > cap), m)
        loss_mat = torch.where(negative, torch.minimum(loss_mat, cap), loss_mat)
    if is_weights is not None:
        loss_mat = loss_mat * is_weights.detach()
    loss = aggregate(loss_mat, m, agg, count)
    with torch.no_grad():
        metrics["pg_loss"] = float(aggregate(loss_mat, m, agg))  # this batch's own mean
        metrics["pg_clipfrac"] = _frac((advantages > 0) & (ratio > 1.0 + clip_high), m)
        metrics["pg_clipfrac_lower"] = _frac((advantages < 0) & (ratio < 1.0 - clip_low), m)
        metrics["approx_kl"] = float(masked_mean((ratio - 1.0) - log_ratio, m))
        metrics["ratio_mean"] = float(masked_mean(ratio, m))
        has_tokens = bool(m.any())
        metrics["ratio_max"] = float(ratio[m].max()) if has_tokens else 0.0
    return loss, metrics


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position, (B, T, V) -> (B, T).

        H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v,   p = softmax(z)
    The second form needs no log p tensor: the only (B, T, V) result kept is the softmax
    (the dot product p . z contracts without materialising p * z).
    """
    probs = torch.softmax(logits, dim=-1)  # (B, T, V)
    return torch.logsumexp(logits, dim=-1) - torch.einsum("...v,...v->...", probs, logits)


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[labels], (B, T, V) and (B, T) -> (B, T).

    Computed as z[label] - logsumexp(z), z = logits / temperature, so no (B, T, V) log-softmax
    is materialised. No shifting happens here: logits[:, t] must already be the prediction
    for labels[:, t] (callers shift), and every label must be a valid id in [0, V) (replace
    ignore indices such as -100 by any id and mask those positions out).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits if temperature == 1.0 else logits / temperature  # (B, T, V)
    picked = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(z, dim=-1)


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    return 0.5 * (logprobs - ref_logprobs).square()


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    log_ratio = (ref_logprobs - logprobs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    # exp(r) - 1 - r, with expm1: exp(r) - 1 cancels for small r and could go below 0
    # (-1.1e-16 at r = 1e-8); expm1(r) >= r holds after rounding too.
    return torch.expm1(log_ratio) - log_ratio


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi, (B, T) -> (B, T).

    k1 = log pi - log pi_ref                       (unbiased, high variance, can be < 0)
    k2 = 0.5 (log pi - log pi_ref)^2               (biased, low variance, >= 0)
    k3 = exp(d) - d - 1, d = log pi_ref - log pi   (Schulman's unbiased low-variance, >= 0;
         d clamped to +-K3_LOG_RATIO_CLAMP before exp)
    """
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)


def truncated_is_weights(train_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """Truncated importance-sampling weights for a rollout/training mismatch, (B, T).

        w = min(exp(train_logprobs - rollout_logprobs), cap)
    where `train_logprobs` are the old policy's log-probs recomputed by the training model
    and `rollout_logprobs` those the rollout engine sampled with (e.g. bf16 decoding, or
    another backend). Tokens the engine over-sampled get w < 1; the cap bounds the
    variance of under-sampled ones. No gradient flows through w.
    """
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    log_w = (train_logprobs - rollout_logprobs).clamp(max=MAX_LOG_RATIO)
    return torch.exp(log_w).clamp(max=cap).detach()


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = 0.5,
    agg: str = "token_mean",
    count: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss (PPO), clip=None disables clipping.

        v_clipped = old + clamp(values - old, -clip, clip)
        loss_mat  = 0.5 * max((values - R)^2, (v_clipped - R)^2)
    Metrics: vf_loss; vf_clipfrac = fraction of masked tokens where the clipped term is the
    larger one (i.e. the gradient is cut off). `agg` and `count` as in `aggregate`.
    """
    vf_losses1 = (values - returns).square()  # (B, T)
    if clip is None:
        vf_losses2 = vf_losses1
    else:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        vf_losses2 = (v_clipped - returns).square()
    loss_mat = 0.5 * torch.maximum(vf_losses1, vf_losses2)
    loss = aggregate(loss_mat, mask, agg, count)
    with torch.no_grad():
        metrics = {
            "vf_loss": float(aggregate(loss_mat, mask, agg)),
            "vf_clipfrac": _frac(vf_losses2 > vf_losses1, mask),
        }
    return loss, metrics


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens (unbiased variances).

    1 is a perfect critic, 0 is no better than a constant, < 0 is worse. When Var(R) = 0
    (constant returns, or fewer than 2 tokens) it returns 0.0 rather than NaN, so logged
    curves and averages stay finite.
    """
    var_returns = masked_var(returns, mask)
    if float(var_returns) == 0.0:
        return 0.0
    return float(1.0 - masked_var(returns - values, mask) / var_returns)
