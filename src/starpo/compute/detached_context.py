"""An approximate, cheaper training forward: the gradient flows only through the tokens
that predict an agent token; every other token (prompt, observations, padding) is
context whose keys and values are constants (`optim.detach_context`).

In a multi-turn dialogue nine tokens in ten are context: the grid the environment
rendered, the chat template around it. The exact update runs forward and backward over
all of them (~6 x weights FLOPs a token); here they run one forward without autograd (~2 x)
and only the few positions the loss reads run forward and backward, attending to the
context's cached keys and values. The log-probs are the exact path's (the forward values
do not change); the gradient drops the terms that reach the weights through the context's
keys and values, which is why it is opt-in.

Two passes, at the sequences' own positions:
1. no_grad: every token of every row, the shared prompt once, into a KV cache
   (`prefix_cache.context_cache`);
2. with grad: the tokens at the read positions only, each attending to the cached context
   before it and to the read positions of its own row up to itself (`read_attention_mask`).
"""

from __future__ import annotations

import torch
from torch import nn

from starpo.compute.batch import TrainBatch
from starpo.errors import UserError
from starpo.models.compat import cache_argument


def check_detachable(
    model: nn.Module, batch: TrainBatch, head: torch.Tensor | None, plain_heads: frozenset
) -> None:
    """optim.detach_context runs the plain-head path (`head`: the LM head's weight, None
    for a model whose type is not among `plain_heads`) on rows of one sequence each."""
    if head is None:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise UserError(
            f"optim.detach_context needs a model whose logits are lm_head(hidden state) "
            f"({', '.join(sorted(plain_heads))}); this one is {kind}: set "
            "optim.detach_context=false"
        )
    if batch.segment_ids is not None:
        raise UserError(
            "optim.detach_context does not support a rollout.context_window that rebuilds "
            "prompts (rows of several sequences) yet; set optim.detach_context=false or "
            "rollout.context_window=full"
        )


def read_rows(batch: TrainBatch, positions: torch.Tensor) -> torch.Tensor:
    """(B, K) bool: which of `positions` each row reads, i.e. predicts one of its own agent
    tokens. Per row, so a row's gradient does not depend on the rows it is batched with."""
    return batch.loss_mask[:, positions + 1] > 0


def read_attention_mask(
    batch: TrainBatch, positions: torch.Tensor, read: torch.Tensor
) -> torch.Tensor:
    """(B, 1, K, T + K) bool, True = attend, for pass 2's K queries at `positions` against
    the T cached keys followed by the K new ones.

    A read query sees the cached context up to its position (real tokens its row does not
    read) and its row's read positions up to itself (the new keys, with gradient). A query
    its row does not read (its output is multiplied by a zero loss mask) sees only the
    cache up to itself and its own new key, so its softmax is never empty and nothing of it
    reaches a read query.
    """
    rows, length = batch.input_ids.shape
    key = torch.arange(length, device=positions.device)
    query = positions[:, None]  # (K, 1)
    read_at = torch.zeros(rows, length, dtype=torch.bool, device=positions.device)
    read_at[:, positions] = read
    context = batch.attention_mask.bool() & ~read_at  # (B, T)
    cached = context[:, None, :] & (key[None, :] <= query)[None]  # (B, K, T)
    earlier = positions[None, :] <= query  # (K, K) new key k at or before query q
    own = torch.eye(len(positions), dtype=torch.bool, device=positions.device)
    new = (read[:, None, :] & read[:, :, None] & earlier[None]) | (~read[:, :, None] & own[None])
    return torch.cat([cached, new], dim=2)[:, None]


def _as_attention_mask(allowed: torch.Tensor, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """Boolean for sdpa, additive (0 / most negative) for eager attention."""
    if kind == "sdpa":
        return allowed
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return blocked.masked_fill_(~allowed, torch.finfo(dtype).min)


def hidden_at_read_positions(
    model: nn.Module,
    batch: TrainBatch,
    positions: torch.Tensor,
    embed,
    cache,
) -> torch.Tensor:
    """Pass 2: final hidden states (B, K, H) at `positions`, as `forward.hidden_at`
    computes them, with gradient only through the positions each row reads (`read_rows`).

    `embed(ids)`: the input embeddings with gradient (`forward._embed`, so a tied LM head
    keeps its single weight gradient); `cache`: pass 1's, every token's keys and values
    without autograd (`prefix_cache.context_cache`).
    """
    decoder = model.get_decoder()
    read = read_rows(batch, positions)
    allowed = read_attention_mask(batch, positions, read)
    embeds = embed(batch.input_ids[:, positions])
    kind = model.config._attn_implementation
    out = decoder(
        inputs_embeds=embeds,
        attention_mask=_as_attention_mask(allowed, kind, embeds.dtype),
        position_ids=positions.expand(len(batch), -1),
        use_cache=True,
        **{cache_argument(decoder): cache},
    )
    return out.last_hidden_state
