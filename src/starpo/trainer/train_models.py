"""The models a StarPO run trains: the actor (policy LM), the critic (LM backbone + value
head), and a frozen reference policy when a KL term is on; optional LoRA for both."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from starpo.compute.activation_checkpointing import enable_gradient_checkpointing
from starpo.compute.batch import TrainBatch
from starpo.compute.forward import hidden_at, trained_positions
from starpo.config import LoraConfig, TrainConfig
from starpo.errors import UserError
from starpo.models.precision import Precision, apply_master_weights


class ValueModel(nn.Module):
    """Critic: a transformer backbone and a linear head giving one value per token."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        # Zero init: every value starts at 0, so early advantages are plain returns.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, batch: TrainBatch) -> torch.Tensor:
        """Values (B, T) of the batch's agent tokens: entry t is the value of the state
        before token t is generated (the head on the final hidden state at t - 1); 0 at
        the positions no row trains on, which every reader masks out.

        The backbone runs as the actor's does (`forward.hidden_at`): a prompt that several
        rows share is encoded once (packed, or through a KV cache), rows of several
        sequences run part by part, and only the positions read reach the head. Running
        every padded row whole, a vanilla PPO update on the bandit counted 9.9 TFLOPs
        instead of 2.2 (docs/training.md).
        """
        targets = trained_positions(batch)  # (K,)
        hidden = hidden_at(self.backbone, batch, targets - 1)  # (B, K, H)
        # The head runs in fp32 even under autocast: values are regression targets' scale.
        with torch.autocast(hidden.device.type, enabled=False):
            read = self.value_head(hidden.float()).squeeze(-1)  # (B, K)
        values = torch.zeros(batch.loss_mask.shape, dtype=read.dtype, device=read.device)
        return values.index_copy(1, targets, read)


@dataclass
class TrainModels:
    actor: nn.Module
    tokenizer: Any
    critic: ValueModel | None
    reference: nn.Module | None  # None with LoRA: the actor with adapters off is the reference
    uses_lora: bool
    precision: Precision = field(default_factory=Precision)  # how every forward computes


def apply_lora(module: nn.Module, lora: LoraConfig, task_type: str | None) -> nn.Module:
    """Wrap `module` with LoRA adapters (the config's `model.lora` section; peft)."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError as exc:  # pragma: no cover - peft is a dependency
        raise UserError("LoRA needs the peft package: pip install peft") from exc
    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type=task_type,
    )
    return get_peft_model(module, config)


def build_models(
    cfg: TrainConfig, actor: nn.Module, tokenizer: Any, precision: Precision | None = None
) -> TrainModels:
    """Critic and reference from the freshly loaded actor (same pretrained weights).

    `precision` (default fp32): trainable weights end up fp32, frozen ones (the reference,
    a LoRA base) in its compute dtype; see `starpo.models.precision`.
    """
    precision = precision or Precision()
    critic = None
    if cfg.algorithm.uses_critic:
        backbone = copy.deepcopy(actor.base_model)
        critic = ValueModel(backbone, actor.config.hidden_size).to(next(actor.parameters()).device)
    reference = None
    lora = cfg.model.lora.enabled
    if cfg.algorithm.uses_reference and not lora:
        reference = copy.deepcopy(actor).eval().requires_grad_(False)
        reference.to(precision.compute_dtype)  # frozen: bf16 storage is enough
    if lora:
        actor = apply_lora(actor, cfg.model.lora, "CAUSAL_LM")
        if critic is not None:
            critic.backbone = apply_lora(critic.backbone, cfg.model.lora, None)
    if cfg.model.gradient_checkpointing:
        # Our own checkpointing, not transformers': that one works only in training mode.
        enable_gradient_checkpointing(actor)
        if critic is not None:
            enable_gradient_checkpointing(critic)
    # Eval mode throughout: no dropout, so training forwards match the rollout's log-probs.
    actor.eval()
    if critic is not None:
        critic.eval()
    apply_master_weights(actor, precision)
    if critic is not None:
        apply_master_weights(critic, precision)
    return TrainModels(actor, tokenizer, critic, reference, lora, precision)
