"""KV caches in the training forward: a prompt that rows share, encoded once and given to
every row (`share_cache`), and a batch encoded without autograd into a cache
(`context_cache`, the context pass of `detached_context`)."""

from __future__ import annotations

import torch
from torch import nn

from starpo.compute.batch import TrainBatch
from starpo.models.compat import cache_argument


def share_cache(cache, rows: int, device: torch.device) -> None:
    """Give all `rows` the prefix's KV cache (computed for one row), differentiably.

    Broadcast views (`expand`), not copies: each layer's cache update concatenates them with
    the rows' own keys anyway, and the backward of a view sums the rows' gradients in one
    reduction (an index copy's backward scatters them one by one). A cache without plain
    per-layer key and value tensors falls back to the cache's own row selection.
    """
    layers = getattr(cache, "layers", None) or []
    plain = all(
        isinstance(getattr(layer, "keys", None), torch.Tensor)
        and isinstance(getattr(layer, "values", None), torch.Tensor)
        for layer in layers
    )
    if not layers or not plain:
        cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=device))
        return
    for layer in layers:
        layer.keys = layer.keys.expand(rows, *layer.keys.shape[1:])
        layer.values = layer.values.expand(rows, *layer.values.shape[1:])


@torch.no_grad()
def context_cache(decoder: nn.Module, batch: TrainBatch, prefix: int):
    """The KV cache of every token of every row, without autograd (pass 1 of
    `detached_context`). A prompt of `prefix` tokens that all rows share (0: none) is
    encoded once and its cache broadcast."""
    name = cache_argument(decoder)
    ids = batch.input_ids
    rows, length = ids.shape
    if not prefix:
        out = decoder(input_ids=ids, attention_mask=batch.attention_mask, use_cache=True)
        return out.get(name)
    cache = decoder(input_ids=ids[:1, :prefix], use_cache=True).get(name)
    share_cache(cache, rows, ids.device)
    decoder(
        input_ids=ids[:, prefix:],
        attention_mask=batch.attention_mask,
        position_ids=torch.arange(prefix, length, device=ids.device).expand(rows, -1),
        use_cache=True,
        **{name: cache},
    )
    return cache
