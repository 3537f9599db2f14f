"""Shared-prefix training forward equals a plain forward: log-probs and gradients."""

from __future__ import annotations

import torch

from starpo.models import tiny_random_model
from starpo.trainer import forward
from starpo.trainer.batch import TrainBatch


def _batch(prefix: int = 40, rows: int = 4, tail: int = 12) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(10, 5000, (1, prefix), generator=g).repeat(rows, 1)
    ids = torch.cat([shared, torch.randint(10, 5000, (rows, tail), generator=g)], dim=1)
    attention = torch.ones_like(ids)
    attention[1, -3:] = 0  # a shorter, right-padded row
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, prefix - 5 : prefix] = 1  # agent tokens inside the shared part (turn 1) ...
    loss_mask[:, prefix + 4 :] = 1  # ... and after it
    loss_mask = loss_mask * attention
    zeros = torch.zeros(ids.shape)
    return TrainBatch(
        ids,
        attention,
        loss_mask,
        zeros,
        zeros,
        zeros[:, :1],
        zeros[:, :1].long(),
        zeros[:, 0],
        torch.zeros(rows, dtype=torch.long),
    )


def _logprobs_and_grads(monkeypatch, share: bool):
    model, _ = tiny_random_model(seed=1)
    if not share:
        monkeypatch.setattr(forward, "MIN_SHARED_PREFIX", 10**9)
    batch = _batch()
    logprobs, entropy = forward.policy_logprobs(model, batch, temperature=0.8)
    (logprobs.sum() + entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def test_shared_prefix_forward_matches_plain_forward(monkeypatch):
    assert forward.shared_prefix_length(_batch()) == 40
    shared = _logprobs_and_grads(monkeypatch, share=True)
    monkeypatch.undo()
    plain = _logprobs_and_grads(monkeypatch, share=False)
    torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=0)
    assert shared[2].keys() == plain[2].keys()
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-4, rtol=1e-4, msg=name)
