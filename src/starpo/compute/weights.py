"""The weights a run trains: which parameters train (all, or LoRA adapters and heads),
their state as tensors (checkpoints, the weight sync to rollout workers), and the policy
exported as a plain Hugging Face folder (`starpo train`'s RUN/final, `starpo sft`'s model)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from starpo.errors import UserError


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters the optimizer updates (all weights, or LoRA adapters and heads)."""
    return [p for p in module.parameters() if p.requires_grad]


def trainable_state(module: nn.Module, copy: bool = True) -> dict[str, torch.Tensor]:
    """The trainable tensors (all weights, or only LoRA adapters and the value head): CPU
    copies, or with `copy=False` the live tensors (for a save that ends before the next
    update)."""
    names = {n for n, p in module.named_parameters() if p.requires_grad}
    state = {k: v for k, v in module.state_dict().items() if k in names}
    return {k: v.detach().cpu().clone() for k, v in state.items()} if copy else state


def load_trainable_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    missing = set(trainable_state(module, copy=False)) - set(state)
    if missing:
        raise UserError(
            f"checkpoint does not match the model ({len(missing)} tensors missing, "
            f"e.g. {sorted(missing)[0]}); resume with the config it was saved with"
        )
    module.load_state_dict(state, strict=False)


def export_policy(actor: nn.Module, tokenizer: Any, folder: Path, uses_lora: bool) -> Path:
    """Write the policy as a plain Hugging Face folder (LoRA merged into a copy), which
    transformers, TRL and vLLM load by the architecture named in its config.json."""
    from starpo.models.embedded import write_tokenizer

    if uses_lora:
        actor = copy.deepcopy(actor).merge_and_unload()
    actor.save_pretrained(folder)
    write_tokenizer(tokenizer, folder)
    return folder
