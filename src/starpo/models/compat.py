"""Small shims over transformers / peft API differences."""

from __future__ import annotations

import inspect

from torch import nn


def cache_argument(model: nn.Module) -> str:
    """Name of the KV-cache keyword of `model.forward`: `cache` in transformers 5.x,
    `past_key_values` before. A peft wrapper forwards keywords to its base model, so the
    base model's signature decides."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def uses_sliding_window(config: object) -> bool:
    """Whether a model attends within a sliding window (Mistral, Qwen2 with it switched
    on): code that builds its own attention (the lean decoder, packed rows) would drop it."""
    window = getattr(config, "sliding_window", None)
    return window is not None and bool(getattr(config, "use_sliding_window", True))
