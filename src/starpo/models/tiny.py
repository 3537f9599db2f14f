"""A tiny random Llama with the real default tokenizer, for tests and quick experiments.

It speaks the same token ids and chat template as the default model, so rollout, masking
and training code can be exercised end to end in well under a second per build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from starpo.errors import UserError
from starpo.models.loading import align_generation_config, load_tokenizer

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase


def tiny_random_model(
    tokenizer: PreTrainedTokenizerBase | None = None,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """A small randomly initialised LlamaForCausalLM (fp32, eval mode, on the CPU).

    The vocabulary is `len(tokenizer)` and the bos/eos/pad ids come from the tokenizer,
    which defaults to the embedded default model's (shared, see `load_tokenizer`). The same
    `seed` gives the same weights; the global torch RNG is left untouched.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    _check_shape(hidden_size, num_heads, num_kv_heads)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,  # like SmolLM2; halves the (vocab x hidden) parameters
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):  # seed locally, leave the global RNG alone
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(torch.float32).eval()
    align_generation_config(model, tokenizer)
    return model, tokenizer


def _check_shape(hidden_size: int, num_heads: int, num_kv_heads: int) -> None:
    """Attention heads must split the hidden size, and kv heads must split the heads."""
    if hidden_size % num_heads:
        raise UserError(
            f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}; "
            f"pick num_heads that divides it"
        )
    if num_heads % num_kv_heads:
        raise UserError(
            f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}; "
            f"pick num_kv_heads that divides it"
        )
