"""Mixed precision as verl/FSDP does it: fp32 master weights, low-precision compute.

Trainable parameters, their gradients and the optimizer state are always fp32: an AdamW
update of ~1e-6 is below bf16's resolution for typical weights, so bf16 weights would
barely move. Frozen weights (the reference model, a LoRA base) are stored in the compute
dtype, and every forward pass runs under `torch.autocast` in that dtype.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Precision:
    """How the trainer's models compute. `compute_dtype` fp32 means no autocast at all."""

    compute_dtype: torch.dtype = torch.float32
    device_type: str = "cpu"  # "cpu" or "cuda": what torch.autocast needs

    @property
    def mixed(self) -> bool:
        return self.compute_dtype != torch.float32

    @property
    def name(self) -> str:
        """Short description for logs, e.g. 'fp32' or 'bf16 autocast, fp32 master weights'."""
        if not self.mixed:
            return "fp32"
        short = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
            self.compute_dtype, str(self.compute_dtype)
        )
        return f"{short} autocast, fp32 master weights"

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context for a forward pass: autocast to the compute dtype (a no-op in fp32)."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.compute_dtype)


def precision_for(dtype: torch.dtype, device: torch.device | str) -> Precision:
    return Precision(compute_dtype=dtype, device_type=torch.device(device).type)


def apply_master_weights(module: nn.Module, precision: Precision) -> None:
    """Trainable parameters to fp32 (master weights), frozen ones to the compute dtype.

    Call it once the trainable set is final (after LoRA wraps the model), before the
    optimizer is built, so the optimizer state is fp32 too.
    """
    for param in module.parameters():
        dtype = torch.float32 if param.requires_grad else precision.compute_dtype
        if param.dtype != dtype and param.is_floating_point():
            param.data = param.data.to(dtype)
