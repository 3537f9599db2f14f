"""Mixed precision as verl/FSDP does it: fp32 master weights, low-precision compute.

Trainable parameters, their gradients and the optimizer state are always fp32: an AdamW
update of ~1e-6 is below bf16's resolution for typical weights, so bf16 weights would
barely move. Frozen weights (the reference model, a LoRA base) are stored in the compute
dtype, and every forward pass runs under `torch.autocast` in that dtype.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from starpo.models.loading import resolve_dtype


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


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (x86 AVX512-BF16 or AMX). There a bf16
    matmul is ~4x faster than fp32 (measured on a 2-core AMD EPYC: 135M parameters' worth
    of linears at 8 rows, 50 ms fp32 against 13.5 ms bf16); elsewhere it is emulated and
    far slower. Read from /proc/cpuinfo (Linux), so the choice never depends on timing;
    the environment variable STARPO_CPU_BF16=0 or 1 overrides it."""
    forced = os.environ.get("STARPO_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def compute_dtype(setting: str | torch.dtype, device: torch.device | str) -> torch.dtype:
    """The dtype a run's forward passes compute in (training, SFT, the memory plan): the
    one reading of `model.dtype` / `--dtype`. auto: bf16 on CUDA and on a CPU with native
    bf16 (2-4x faster there), fp32 on any other CPU, where an emulated bf16 matmul ran 75x
    slower than fp32 (0.6 against 46 GFLOP/s on an AVX2 laptop CPU). An explicit value is
    taken as it is."""
    device = torch.device(device)
    if isinstance(setting, str) and setting.strip().lower() == "auto" and device.type == "cpu":
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32
    return resolve_dtype(setting, device)


def rollout_dtype(setting: str, compute_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype rollouts decode in. auto: the trainer's compute dtype, or bf16 on a CPU
    with native bf16 (decoding reads every weight once per token: half the bytes)."""
    if setting != "auto":
        return resolve_dtype(setting, torch.device(device))
    if compute_dtype != torch.float32:
        return compute_dtype
    native = torch.device(device).type == "cpu" and cpu_has_native_bf16()
    return torch.bfloat16 if native else torch.float32
