"""Masked statistics against plain-Python references."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from starpo.algorithms import masked_mean, masked_sum, masked_var, masked_whiten


def _masked_values(x: torch.Tensor, mask: torch.Tensor) -> list[float]:
    xs, ms = x.tolist(), mask.tolist()
    return [
        v for row, mrow in zip(xs, ms, strict=True) for v, m in zip(row, mrow, strict=True) if m
    ]


@pytest.mark.parametrize("seed", range(4))
def test_mean_and_var_match_reference(batch_factory, seed):
    batch = batch_factory(seed)
    x, mask = batch.values_t(), batch.mask_t()
    picked = _masked_values(x, mask)
    assert masked_sum(x, mask).item() == pytest.approx(math.fsum(picked))
    assert masked_mean(x, mask).item() == pytest.approx(statistics.fmean(picked))
    assert masked_var(x, mask).item() == pytest.approx(statistics.variance(picked))
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(statistics.pvariance(picked))


def test_mean_along_dim_gives_zero_for_empty_rows(batch_factory):
    batch = batch_factory(7)
    x, mask = batch.values_t(), batch.mask_t()
    row_means = masked_mean(x, mask, dim=1).tolist()
    assert row_means[0] == 0.0  # row 0 has no agent tokens
    for row, mrow, got in zip(batch.values, batch.mask, row_means, strict=True):
        picked = [v for v, m in zip(row, mrow, strict=True) if m]
        assert got == pytest.approx(statistics.fmean(picked) if picked else 0.0)


def test_unmasked_inf_and_nan_do_not_leak():
    x = torch.tensor([[1.0, float("-inf"), 3.0, float("nan")]])
    mask = torch.tensor([[1, 0, 1, 0]])
    assert masked_mean(x, mask).item() == 2.0
    assert masked_var(x, mask).item() == 2.0
    assert torch.equal(masked_whiten(x, mask)[0, [1, 3]], torch.zeros(2))


def test_degenerate_variance_is_zero():
    x = torch.tensor([[5.0, 7.0]])
    assert masked_var(x, torch.tensor([[0, 0]])).item() == 0.0
    assert masked_var(x, torch.tensor([[1, 0]])).item() == 0.0
    assert masked_var(x, torch.tensor([[1, 0]]), unbiased=False).item() == 0.0
    assert masked_whiten(x, torch.tensor([[1, 0]])).tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("seed", range(4))
def test_whiten_gives_mean_zero_std_one_over_masked_tokens(batch_factory, seed):
    batch = batch_factory(seed, batch=6, length=24)
    x, mask = batch.values_t() * 3.0 + 2.0, batch.mask_t()
    white = masked_whiten(x, mask)
    picked = _masked_values(white, mask)
    assert statistics.fmean(picked) == pytest.approx(0.0, abs=1e-9)
    assert statistics.stdev(picked) == pytest.approx(1.0, rel=1e-6)
    assert torch.all(white[mask == 0] == 0)
    # Reference: (x - mean) / sqrt(var + eps) with the unbiased var.
    raw = _masked_values(x, mask)
    mean, var = statistics.fmean(raw), statistics.variance(raw)
    expected = [(v - mean) / math.sqrt(var + 1e-8) for v in raw]
    assert picked == pytest.approx(expected)


def test_whiten_without_mean_shift_keeps_the_mean(batch_factory):
    batch = batch_factory(3, batch=6, length=24)
    x, mask = batch.values_t() + 4.0, batch.mask_t()
    picked = _masked_values(masked_whiten(x, mask, shift_mean=False), mask)
    raw = _masked_values(x, mask)
    assert statistics.fmean(picked) == pytest.approx(statistics.fmean(raw))
    assert statistics.stdev(picked) == pytest.approx(1.0, rel=1e-6)
