"""Token log-probs and entropy straight from final hidden states and the output embedding.

    z = h W^T / temperature                         (N, V) logits, never held whole
    logprob = z[label] - logsumexp(z)
    entropy = logsumexp(z) - sum_v p_v z_v,   p = softmax(z)

The vocabulary is processed in slabs of columns: each slab's logits are computed, folded
into a running logsumexp and p.z sum (the online-softmax recurrence), and kept for backward,
so no (N, V) tensor is ever allocated and every elementwise pass runs on a slab that fits in
cache. Backward works slab by slab from the kept logits, with per-row statistics from forward:

    d logprob / d z = onehot(label) - p
    d entropy / d z = -p (z - sum_v p_v z_v)          (= -p (log p + H))

so dL/dz = g_lp onehot - p (a + g_H z) with a = g_lp - g_H sum_v p_v z_v, and the two
matmuls of a linear layer's backward run per slab: dL/dh += dL/dz W_slab / temperature and
dL/dW_slab = dL/dz^T h / temperature.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: Elements per vocabulary slab (rows x columns): ~1 MiB of fp32, an L2 cache's worth.
SLAB_ELEMENTS = 1 << 18
MIN_SLAB_COLUMNS = 1024


def slab_columns(rows: int, vocab: int) -> int:
    """Vocabulary columns per slab for `rows` hidden states: about SLAB_ELEMENTS values,
    at least MIN_SLAB_COLUMNS (the matmul stays efficient), a multiple of 64."""
    columns = max(MIN_SLAB_COLUMNS, SLAB_ELEMENTS // max(rows, 1)) // 64 * 64
    return min(columns, vocab)


def _slab_logits(hidden: Tensor, weight: Tensor, start: int, stop: int, temperature: float):
    """fp32 logits / temperature of vocabulary columns [start, stop), (N, stop - start)."""
    z = (hidden @ weight[start:stop].T).float()
    return z if temperature == 1.0 else z.div_(temperature)


def _head_forward(
    hidden: Tensor, weight: Tensor, labels: Tensor, temperature: float, keep: bool
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """(logsumexp (N,), sum_v p_v z_v (N,), z[label] (N,), kept slabs) of z = hW^T / T."""
    rows, vocab = hidden.shape[0], weight.shape[0]
    step = slab_columns(rows, vocab)
    top = torch.full((rows,), -torch.inf, device=hidden.device)  # running max
    total = torch.zeros(rows, device=hidden.device)  # sum exp(z - top)
    dot = torch.zeros(rows, device=hidden.device)  # sum exp(z - top) z
    picked = torch.zeros(rows, device=hidden.device)
    slabs = []
    for start in range(0, vocab, step):
        stop = min(start + step, vocab)
        z = _slab_logits(hidden, weight, start, stop, temperature)  # (N, S)
        new_top = torch.maximum(top, z.amax(dim=1))
        rescale = torch.exp(top - new_top)  # 0 on the first slab (exp(-inf))
        e = torch.exp(z - new_top.unsqueeze(1))  # (N, S)
        total = total * rescale + e.sum(dim=1)
        dot = dot * rescale + torch.linalg.vecdot(e, z)
        top = new_top
        inside = (labels >= start) & (labels < stop)
        rows_in = torch.nonzero(inside).squeeze(1)
        picked[rows_in] = z[rows_in, labels[rows_in] - start]
        if keep:
            slabs.append(z)
    lse = top + torch.log(total)
    return lse, dot / total, picked, slabs


class _HeadLogprobs(torch.autograd.Function):
    """Autograd for `head_logprobs`: forward keeps the logits slab by slab, backward
    turns each into its share of dL/dh and dL/dW (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, dtype, grad_sink):
        h, w = hidden.to(dtype), weight.to(dtype)  # no-ops in fp32
        lse, mean_z, picked, slabs = _head_forward(h, w, labels, temperature, True)
        ctx.temperature, ctx.grad_sink = temperature, grad_sink
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.save_for_backward(h, w, labels, lse, mean_z, *slabs)
        return picked - lse, lse - mean_z

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, grad_entropy):
        h, w, labels, lse, mean_z, *slabs = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        scale = -1.0 / ctx.temperature  # dz/dlogits = 1/T; the slabs give -dL/dz
        g_lp, g_h = grad_logprobs.float(), grad_entropy.float()
        a = (g_lp - g_h * mean_z).unsqueeze(1)  # (N, 1)
        grad_hidden = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = torch.empty(w.shape, dtype=weight_dtype, device=w.device)
        start = 0
        for z in slabs:
            stop = start + z.shape[1]
            p = torch.exp(z - lse.unsqueeze(1))  # (N, S)
            neg_grad = p.mul_(torch.addcmul(a, g_h.unsqueeze(1), z))  # p (a + g_H z)
            inside = torch.nonzero((labels >= start) & (labels < stop)).squeeze(1)
            neg_grad[inside, labels[inside] - start] -= g_lp[inside]  # - g_lp onehot
            neg_grad = neg_grad.to(h.dtype)
            _add_matmul(grad_hidden, neg_grad, w[start:stop], scale)
            if grad_weight is not None:
                _write_matmul(grad_weight[start:stop], neg_grad.T, h, scale)
            start = stop
        if grad_weight is not None and ctx.grad_sink is not None:
            ctx.grad_sink.append(grad_weight)
        return grad_hidden.to(hidden_dtype), grad_weight, None, None, None, None


def _add_matmul(out: Tensor, a: Tensor, b: Tensor, scale: float) -> None:
    """out += scale * a @ b, in out's dtype (fp32) whatever the matmul's dtype."""
    if a.dtype == out.dtype:
        out.addmm_(a, b, alpha=scale)
    else:
        out.add_(a @ b, alpha=scale)


def _write_matmul(out: Tensor, a: Tensor, b: Tensor, scale: float) -> None:
    """out = scale * a @ b, in out's dtype; out's old values are never read."""
    if a.dtype == out.dtype:
        out.addmm_(a, b, beta=0.0, alpha=scale)
    else:
        torch.mul(a @ b, scale, out=out)


def head_logprobs(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    dtype: torch.dtype | None = None,
    grad_sink: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of `labels` and entropy under softmax(hidden @ weight.T / temperature).

    hidden (N, H), weight (V, H) (an LM head without bias), labels (N,) in [0, V) ->
    (logprobs (N,), entropy (N,) or None), fp32. The matmuls run in `dtype` (default:
    weight's; e.g. bf16 under autocast, with gradients returned in hidden's and weight's
    own dtypes), the softmax in fp32. Equal to `token_logprobs` and `entropy_from_logits`
    over the full logits, with gradients for hidden and weight; keeps N x V fp32 values
    for backward (as the full logits would) but allocates no (N, V) tensor.

    `grad_sink`: a list that backward appends weight's gradient to before handing it to
    autograd, so that a tied input embedding can add its rows to it in place.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = dtype or weight.dtype
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        logprobs, entropy = _HeadLogprobs.apply(
            hidden, weight, labels, float(temperature), dtype, grad_sink
        )
    else:  # nothing to differentiate: keep no logits
        h, w = hidden.to(dtype), weight.to(dtype)
        lse, mean_z, picked, _ = _head_forward(h, w, labels, temperature, False)
        logprobs, entropy = picked - lse, lse - mean_z
    return logprobs, entropy if with_entropy else None
