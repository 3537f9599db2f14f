"""Statistics over the masked (agent-generated) tokens of a padded batch.

Every function reads `x` only where `mask` is set: unmasked positions may hold anything
(padding logits, -inf log-probs) without leaking NaN into the result, because they are
selected away with `torch.where` rather than multiplied by zero (0 * inf = NaN).
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_{t: m_t = 1} x_t, over all elements (dim=None) or along `dim`."""
    selected = torch.where(mask.bool(), x, torch.zeros_like(x))
    return selected.sum() if dim is None else selected.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """mean = sum_t m_t x_t / sum_t m_t, over all elements or along `dim`.

    A slice with no masked element has mean 0 (not NaN), so empty sequences cannot poison
    a batch statistic.
    """
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over all masked elements (a scalar).

    var = sum_t m_t (x_t - mean)^2 / (n - 1)   (unbiased, Bessel's correction)
    var = sum_t m_t (x_t - mean)^2 / n         (biased)
    with n = sum_t m_t. Degenerate cases (n = 0, or n = 1 when unbiased) give 0: one value
    has no spread to normalise by, and whitening it then yields 0 rather than NaN.
    """
    count = mask.bool().sum()
    centered = x - masked_mean(x, mask)
    sum_sq = masked_sum(centered * centered, mask)
    denom = count - 1 if unbiased else count
    if denom <= 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return sum_sq / denom.to(x.dtype)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten over the masked elements: (x - mean) / sqrt(var + eps).

    mean and the unbiased var are taken over masked elements only. With shift_mean=False the
    mean is added back (only the scale changes). Unmasked positions of the result are 0.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))
