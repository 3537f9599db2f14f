"""Policy models: the embedded default (SmolLM2-135M-Instruct), any Hugging Face causal LM
(a local folder or a hub id), and tiny random models for tests.

    from starpo.models import load_model, tiny_random_model
    model, tokenizer = load_model()            # the default; converted once, then cached
    model, tokenizer = tiny_random_model()     # 2 layers, real tokenizer, for tests
"""

from __future__ import annotations

from starpo.models.embedded import DEFAULT_MODEL, cache_root, default_model_dir
from starpo.models.loading import (
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    stop_token_ids,
)
from starpo.models.tiny import tiny_random_model

__all__ = [
    "DEFAULT_MODEL",
    "cache_root",
    "default_model_dir",
    "load_model",
    "load_tokenizer",
    "resolve_device",
    "resolve_dtype",
    "stop_token_ids",
    "tiny_random_model",
]
