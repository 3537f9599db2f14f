"""Training-time forward passes: token log-probs and entropy of the actor, values of the
critic, log-probs of the reference policy. All outputs are (B, T), aligned to tokens."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from starpo.algorithms import entropy_from_logits, token_logprobs
from starpo.models.compat import cache_argument
from starpo.trainer.batch import TrainBatch

#: Shortest common prefix worth encoding once for the whole micro-batch.
MIN_SHARED_PREFIX = 16


def shared_prefix_length(batch: TrainBatch) -> int:
    """Tokens at the start that every row has in common (all rollouts of a group begin with
    the same prompt), capped so every row keeps at least one token after it."""
    ids = batch.input_ids
    differs = torch.nonzero(~(ids == ids[:1]).all(dim=0))
    prefix = int(differs[0]) if len(differs) else ids.shape[1]
    return min(prefix, int(batch.attention_mask.sum(dim=1).min()) - 1)


def logits_at(model: nn.Module, batch: TrainBatch, positions: torch.Tensor) -> torch.Tensor:
    """Logits (B, K, V) at sequence `positions`, encoding a shared prompt prefix only once.

    Exact: the prefix runs for one row and its KV cache is copied to every row (a
    differentiable copy), so gradients through the prompt add up over the rows as in a full
    forward pass, at a fraction of the compute when the prompt is long.
    """
    prefix = shared_prefix_length(batch)
    if len(batch) == 1 or prefix < MIN_SHARED_PREFIX:
        out = model(  # no KV cache: nothing reads it, it would only hold memory until backward
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            logits_to_keep=positions,
            use_cache=False,
        )
        return out.logits
    rows, length = batch.input_ids.shape
    early, late = positions[positions < prefix], positions[positions >= prefix]
    name = cache_argument(model)
    head = model(
        input_ids=batch.input_ids[:1, :prefix],
        use_cache=True,
        logits_to_keep=early if len(early) else 1,
    )
    cache = head[name]
    cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=positions.device))
    tail = model(
        input_ids=batch.input_ids[:, prefix:],
        attention_mask=batch.attention_mask,
        position_ids=torch.arange(prefix, length, device=positions.device).expand(rows, -1),
        logits_to_keep=late - prefix,
        **{name: cache},
    )
    if not len(early):
        return tail.logits
    return torch.cat([head.logits.expand(rows, -1, -1), tail.logits], dim=1)


def policy_logprobs(
    model: nn.Module, batch: TrainBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of every agent token under `model` at `temperature`.

    The LM head runs only at positions that predict an agent token somewhere in the batch
    (`logits_to_keep`), which saves most of the (B, T, vocab) logits on long prompts, and a
    prompt shared by all rows is encoded once (`logits_at`).
    """
    targets = torch.nonzero(batch.loss_mask.any(dim=0)).squeeze(1)  # (K,) token positions
    targets = targets[targets > 0]  # token 0 has no prediction
    logits = logits_at(model, batch, targets - 1).float() / max(temperature, 1e-6)  # (B,K,V)
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
    model = reference if reference is not None else actor
    with torch.no_grad(), disabled:
        logprobs, _ = policy_logprobs(model, batch, temperature, with_entropy=False)
    return logprobs
