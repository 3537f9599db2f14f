"""Gradient checkpointing that leaves the models in eval mode and the KV cache working.

transformers checkpoints its decoder layers only in training mode, which would switch dropout
on (training forwards must reproduce the rollout's log-probs exactly), and it drops the KV
cache while checkpointing, which the shared-prompt forward (`forward.hidden_at`) passes from
the prompt to the rest of the rows. So we checkpoint each decoder layer ourselves, in any
mode: only the layer's inputs are kept for backward and its activations are recomputed there.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from starpo.errors import UserError

#: The keyword a decoder layer gets its KV cache under, across transformers versions.
CACHE_KEYWORDS = ("cache", "past_key_values", "past_key_value")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of `model` (also inside a peft wrapper or a `ValueModel`)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError as exc:  # transformers < 4.52
        raise UserError(
            "model.gradient_checkpointing needs transformers>=4.56: pip install -U transformers"
        ) from exc
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute every decoder layer of `model` in backward instead of keeping its
    activations; outputs and gradients are unchanged."""
    layers = decoder_layers(model)
    if not layers:
        raise UserError(
            f"model.gradient_checkpointing: no decoder layers found in {type(model).__name__}; "
            "set it to false for this model"
        )
    for layer in layers:
        # An instance attribute shadows the class's forward, inside nn.Module.__call__ (so
        # module hooks run once, outside the checkpoint). A partial, not a closure: copies of
        # the model (copy.deepcopy) get a forward bound to their own layer.
        layer.forward = functools.partial(checkpointed_forward, layer)


def checkpointed_forward(layer: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """`layer`'s own forward under a non-reentrant checkpoint.

    Non-reentrant: gradients also flow through tensors that leave the layer by the side
    door (the keys and values it writes to the KV cache, which the tail of a shared-prefix
    forward reads), and inputs need not require grad (frozen embeddings under LoRA).
    """
    run = functools.partial(type(layer).forward, layer)
    if not torch.is_grad_enabled():  # generation, reference log-probs: no backward to serve
        return run(*args, **kwargs)
    name = next((k for k in CACHE_KEYWORDS if kwargs.get(k) is not None), None)
    if name is None:
        return checkpoint(functools.partial(run, **kwargs), *args, use_reentrant=False)
    return checkpoint(_replayable(run, name, kwargs), *args, use_reentrant=False)


def _replayable(run: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """`run(*args, **kwargs)` that can be replayed by the backward recompute.

    The layer appends its keys and values to the cache. The first call does so on the real
    cache; a replay gets a copy of the cache as it was before the first call, so it attends
    to the same keys and values without appending them a second time. The real cache is
    not referenced after the first call, so it is freed as usual.
    """
    before = _copy_cache(kwargs[name])
    others = {k: v for k, v in kwargs.items() if k != name}
    first = [kwargs]

    def call(*args: Any) -> Any:
        if first:
            return run(*args, **first.pop())
        return run(*args, **others, **{name: _copy_cache(before)})

    return call


def _copy_cache(cache: Any) -> Any:
    """A copy of a transformers `Cache` that can be updated without changing `cache`.

    Shallow: the layers of a dynamic cache rebind their tensors on update (`torch.cat`), so
    no key or value tensor is copied; the copy only keeps those already there alive.
    """
    if not hasattr(cache, "layers"):
        raise UserError(
            "model.gradient_checkpointing needs transformers>=4.56 (a KV cache with `layers`): "
            "pip install -U transformers"
        )
    copied = copy.copy(cache)
    copied.layers = [copy.copy(layer) for layer in cache.layers]
    return copied
