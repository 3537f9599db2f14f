"""The optimisation settings of an SFT run; torch-free, so `starpo --help` stays fast."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from starpo.compute.lr_schedule import SCHEDULES
from starpo.errors import UserError

DTYPES = ("auto", "fp32", "bf16")


def _option(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class TrainOptions:
    """Optimisation settings of an SFT run (the `starpo sft` flags of the same names)."""

    epochs: int = _option(3, "Passes over the training examples.")
    # 2e-5: TRL's SFT default, in the usual 1e-5..5e-5 of full fine-tuning for 0.1B-1B chat
    # models. The SFT data is narrow (one env's turns), so a rate high enough to learn the
    # answer format in a few hundred steps of 8 trajectories, low enough not to wipe out
    # the instruct model's language in that time.
    lr: float = _option(2e-5, "Peak learning rate of AdamW.")
    batch_size: int = _option(8, "Trajectories per optimizer step.")
    micro_batch_size: int = _option(4, "Trajectories per forward pass (gradient accumulation).")
    warmup_ratio: float = _option(0.05, "Share of optimizer steps with a linear warm-up.")
    schedule: str = _option("cosine", "LR after warm-up: cosine (to 0) or constant.")
    weight_decay: float = _option(0.0, "AdamW weight decay (TRL's SFT default: 0).")
    max_grad_norm: float = _option(1.0, "Clip the gradient norm to this; 0 = no clipping.")
    val_fraction: float = _option(0.1, "Share of the seeds held out for the validation loss.")
    seed: int = _option(0, "Seed of the split, the shuffling and torch.")
    # bf16 autocast keeps fp32 master weights and optimizer state; on a CPU with native
    # bf16 (AVX512-BF16/AMX) its matmuls are ~4x faster, a whole SFT step ~1.7x.
    dtype: str = _option(
        "auto",
        "Compute dtype: auto (bf16 on CUDA and on a CPU with native bf16, else fp32), "
        "fp32 or bf16 (autocast).",
    )

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"--{_dashed(name)} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.lr < math.inf:
            raise UserError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.schedule not in SCHEDULES:
            raise UserError(
                f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule}"
            )
        for name in ("warmup_ratio", "val_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"--{_dashed(name)} must be in [0, 1), got {getattr(self, name)}")
        if self.dtype not in DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype}")
        for name in ("weight_decay", "max_grad_norm"):  # NaN and inf fail too
            if not 0 <= getattr(self, name) < math.inf:
                raise UserError(
                    f"--{_dashed(name)} must be a finite number >= 0, got {getattr(self, name)}"
                )


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def option_help() -> dict[str, tuple[object, str]]:
    """{name: (default, help)} of every option, for the command's flags."""
    return {f.name: (f.default, f.metadata["help"]) for f in fields(TrainOptions)}
