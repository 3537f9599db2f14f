"""A trained policy's export (`RUN/final`) is a plain Hugging Face folder: config.json names
its architecture, and plain transformers calls load it."""

from __future__ import annotations

import json

import pytest
import torch

from starpo.compute.weights import export_policy
from starpo.models import load_model, tiny_random_model


def _with_lora(model):
    """`model` wrapped in LoRA adapters whose update is not zero (so merging matters)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    wrapped = get_peft_model(model, config)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.05)
    return wrapped.eval()


@pytest.mark.parametrize("uses_lora", [False, True], ids=["full", "lora-merged"])
def test_exported_folder_names_its_architecture_and_loads_plainly(tmp_path, uses_lora):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = tiny_random_model(seed=5)
    actor = _with_lora(model) if uses_lora else model
    folder = export_policy(actor, tokenizer, tmp_path / "final", uses_lora)  # RUN/final

    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]  # save_pretrained writes it
    assert not (folder / "adapter_config.json").exists()  # merged, not an adapter folder
    assert {"model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    plain = AutoModelForCausalLM.from_pretrained(folder).eval()
    by_name = getattr(transformers, config["architectures"][0]).from_pretrained(folder).eval()
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        expected = actor(input_ids=ids).logits
        assert torch.allclose(plain(ids).logits, expected, atol=1e-5)
        assert torch.allclose(by_name(ids).logits, expected, atol=1e-5)
    assert AutoTokenizer.from_pretrained(folder).chat_template == tokenizer.chat_template
    reloaded, _ = load_model(folder)  # and `starpo eval --model RUN/final` reads it
    assert type(reloaded).__name__ == "LlamaForCausalLM"
