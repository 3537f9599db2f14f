"""Training-time forward passes: token log-probs and entropy of the actor, values of the
critic, log-probs of the reference policy. All outputs are (B, T), aligned to tokens."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from starpo.algorithms import entropy_from_logits, token_logprobs
from starpo.trainer.batch import TrainBatch


def policy_logprobs(
    model: nn.Module, batch: TrainBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of every agent token under `model` at `temperature`.

    The LM head runs only at positions that predict an agent token somewhere in the batch
    (`logits_to_keep`), which saves most of the (B, T, vocab) logits on long prompts.
    """
    targets = torch.nonzero(batch.loss_mask.any(dim=0)).squeeze(1)  # (K,) token positions
    targets = targets[targets > 0]  # token 0 has no prediction
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=targets - 1
    )
    logits = out.logits.float() / max(temperature, 1e-6)  # (B, K, V)
    labels = batch.input_ids[:, targets]  # (B, K)
    logprobs = torch.zeros_like(batch.loss_mask)
    logprobs = logprobs.index_copy(1, targets, token_logprobs(logits, labels))
    if not with_entropy:
        return logprobs * batch.loss_mask, None
    entropy = torch.zeros_like(batch.loss_mask).index_copy(1, targets, entropy_from_logits(logits))
    return logprobs * batch.loss_mask, entropy * batch.loss_mask


def reference_logprobs(
    actor: nn.Module, reference: nn.Module | None, batch: TrainBatch, temperature: float
) -> torch.Tensor:
    """Log-probs under the reference policy: a frozen copy, or the LoRA actor with its
    adapters switched off (the base weights are the reference)."""
    disabled = contextlib.nullcontext() if reference is not None else actor.disable_adapter()
    with torch.no_grad(), disabled:
        logprobs, _ = policy_logprobs(
            reference if reference is not None else actor, batch, temperature, with_entropy=False
        )
    return logprobs
