"""head_logprobs (log-probs and entropy from hidden states, vocabulary in slabs) against the
naive computation over the full logits: values and gradients, for any slab size."""

from __future__ import annotations

import pytest
import torch

from starpo.algorithms import entropy_from_logits, head_logprobs, token_logprobs
from starpo.algorithms import head as head_module

ROWS, HIDDEN, VOCAB = 7, 16, 1000


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, HIDDEN, generator=g).to(dtype).requires_grad_()
    weight = (0.5 * torch.randn(VOCAB, HIDDEN, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (ROWS,), generator=g)
    labels[0], labels[1] = 0, VOCAB - 1  # the first and the last column
    mix = torch.randn(2, ROWS, generator=g)  # loss weights: both outputs get gradients
    return hidden, weight, labels, mix


def _naive(hidden, weight, labels, temperature):
    logits = (hidden @ weight.T).float() / temperature  # (N, V), as the logits path does
    return token_logprobs(logits, labels), entropy_from_logits(logits)


def _values_and_grads(fn, hidden, weight, labels, mix, temperature):
    logprobs, entropy = fn(hidden, weight, labels, temperature)
    (mix[0] @ logprobs + mix[1] @ entropy).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    return logprobs.detach(), entropy.detach(), *grads


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("slab", [64, 448, 1 << 20], ids=["many-slabs", "uneven", "one-slab"])
def test_matches_the_full_logits(monkeypatch, temperature, slab):
    monkeypatch.setattr(head_module, "SLAB_ELEMENTS", slab * ROWS)
    monkeypatch.setattr(head_module, "MIN_SLAB_COLUMNS", 64)
    inputs = _inputs()
    got = _values_and_grads(head_logprobs, *inputs, temperature)
    want = _values_and_grads(_naive, *inputs, temperature)
    for name, g, w in zip(("logprobs", "entropy", "d hidden", "d weight"), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)  # O(1) values


def test_slab_columns_cover_the_vocabulary_in_cache_sized_steps():
    assert head_module.slab_columns(8, 49152) % 64 == 0
    assert head_module.slab_columns(8, 49152) * 8 <= 2 * head_module.SLAB_ELEMENTS
    assert head_module.slab_columns(100_000, 49152) == head_module.MIN_SLAB_COLUMNS
    assert head_module.slab_columns(1, 500) == 500  # never wider than the vocabulary


def test_without_gradients_it_keeps_nothing_and_gives_the_same_values():
    hidden, weight, labels, _ = _inputs()
    with torch.no_grad():
        quiet = head_logprobs(hidden, weight, labels, 0.7)
    tracked = head_logprobs(hidden, weight, labels, 0.7)
    assert quiet[0].grad_fn is None and tracked[0].grad_fn is not None
    torch.testing.assert_close(quiet[0], tracked[0].detach(), rtol=0, atol=0)
    torch.testing.assert_close(quiet[1], tracked[1].detach(), rtol=0, atol=0)
    assert head_logprobs(hidden, weight, labels, with_entropy=False)[1] is None


def test_grad_sink_gets_the_weight_gradient_autograd_accumulates():
    hidden, weight, labels, mix = _inputs()
    sink: list[torch.Tensor] = []
    logprobs, entropy = head_logprobs(hidden, weight, labels, grad_sink=sink)
    (mix[0] @ logprobs + mix[1] @ entropy).backward()
    assert len(sink) == 1
    torch.testing.assert_close(sink[0], weight.grad, rtol=0, atol=0)


def test_bf16_compute_keeps_fp32_gradients_close_to_the_fp32_result():
    hidden, weight, labels, mix = _inputs(seed=1)
    exact = _values_and_grads(_naive, hidden, weight, labels, mix, 1.0)

    def bf16(h, w, y, t):
        return head_logprobs(h, w, y, t, dtype=torch.bfloat16)

    got = _values_and_grads(bf16, hidden, weight, labels, mix, 1.0)
    assert got[2].dtype == got[3].dtype == torch.float32  # gradients in the inputs' dtype
    for g, w in zip(got, exact, strict=True):
        assert float((g - w).norm() / w.norm()) < 0.02


def test_rejects_a_non_positive_temperature():
    hidden, weight, labels, _ = _inputs()
    with pytest.raises(ValueError, match="temperature"):
        head_logprobs(hidden, weight, labels, 0.0)
