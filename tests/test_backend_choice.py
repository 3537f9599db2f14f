"""rollout.backend=auto has one rule (`auto_picks_lean`), asked by the trainer's factory on
the built model and by the memory plan on the model's config before it loads: both see
the same reasons to fall back to the hf backend."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import LlamaConfig

from starpo.config import load_config
from starpo.memory.plan import runtime_for
from starpo.rollout.backends.lean import auto_picks_lean, build_auto_backend
from starpo.rollout.backends.lean_decoder import lean_config_support


def llama_config(**changes) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        **changes,
    )


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (llama_config(), None),
        (llama_config(hidden_act="gelu"), "activation 'gelu' is not silu"),
        (SimpleNamespace(model_type="gpt2"), "model type 'gpt2' is not one of"),
    ],
)
def test_the_plan_and_the_trainer_fall_back_for_the_same_reasons(config, reason):
    from transformers import LlamaForCausalLM

    found = lean_config_support(config)
    assert found is None if reason is None else found.startswith(reason)
    cfg = load_config(None, ["rollout.backend=auto", "model.dtype=fp32"])
    planned = runtime_for(cfg, config.model_type, config)
    assert planned.lean is auto_picks_lean(True, found)
    if isinstance(config, LlamaConfig):
        backend = build_auto_backend(LlamaForCausalLM(config), SimpleNamespace(pad_token_id=0))
        assert (backend.numerics.name == "lean") is planned.lean


def test_lora_and_a_gpu_rule_the_lean_decoder_out():
    assert lean_config_support(llama_config(), lora=True).startswith("LoRA adapters")
    assert not auto_picks_lean(False, None) and auto_picks_lean(True, None)
