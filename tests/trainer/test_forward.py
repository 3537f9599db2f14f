"""Shared-prefix training forward equals a plain forward: log-probs and gradients."""

from __future__ import annotations

import torch

from starpo.compute import forward
from starpo.compute.batch import TrainBatch
from starpo.models import tiny_random_model


def _logprobs_and_grads(monkeypatch, batch: TrainBatch, share: bool):
    model, _ = tiny_random_model(seed=1)
    if not share:
        monkeypatch.setattr(forward, "MIN_SHARED_PREFIX", 10**9)
    logprobs, entropy = forward.policy_logprobs(model, batch, temperature=0.8)
    (logprobs.sum() + entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def test_common_prefix_length_keeps_a_token_of_every_row():
    rows = torch.tensor([[1, 2, 3, 4], [1, 2, 5, -1], [1, 2, 3, -1]])
    assert forward.common_prefix_length(rows, torch.tensor([4, 3, 3])) == 2
    rows = torch.tensor([[1, 2], [1, 2]])
    assert forward.common_prefix_length(rows, torch.tensor([2, 2])) == 1


def test_shared_prefix_forward_matches_plain_forward(monkeypatch, prompt_batch):
    # Agent tokens inside the shared part (turn 1) and after it.
    batch = prompt_batch(40, 12, first_turn=5, last_agent=8)
    assert forward.shared_prefix_length(batch) == 40
    shared = _logprobs_and_grads(monkeypatch, batch, share=True)
    monkeypatch.undo()
    plain = _logprobs_and_grads(monkeypatch, batch, share=False)
    torch.testing.assert_close(shared[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared[1], plain[1], atol=1e-5, rtol=0)
    assert shared[2].keys() == plain[2].keys()
    for name, grad in plain[2].items():
        torch.testing.assert_close(shared[2][name], grad, atol=1e-4, rtol=1e-4, msg=name)
