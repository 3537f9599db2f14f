"""The optimisation settings of an SFT run; torch-free, so `starpo --help` stays fast."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, model_validator

from starpo.compute.lr_schedule import SCHEDULES
from starpo.config.episode import check_settings
from starpo.config.fields import ConfigSection
from starpo.config.fields import config_field as _option

DTYPES = ("auto", "fp32", "bf16")


class TrainOptions(ConfigSection):
    """Optimisation settings of an SFT run (the `starpo sft` flags of the same names)."""

    model_config = ConfigDict(frozen=True)

    epochs: int = _option(3, "Passes over the training examples.", ge=1)
    # 2e-5: TRL's SFT default, in the usual 1e-5..5e-5 of full fine-tuning for 0.1B-1B chat
    # models. The SFT data is narrow (one env's turns), so a rate high enough to learn the
    # answer format in a few hundred steps of 8 trajectories, low enough not to wipe out
    # the instruct model's language in that time.
    lr: float = _option(2e-5, "Peak learning rate of AdamW.", gt=0)
    batch_size: int = _option(8, "Trajectories per optimizer step.", ge=1)
    micro_batch_size: int = _option(
        4, "Trajectories per forward pass (gradient accumulation).", ge=1
    )
    warmup_ratio: float = _option(
        0.05, "Share of optimizer steps with a linear warm-up.", ge=0, lt=1
    )
    schedule: str = _option(
        "cosine", "LR after warm-up: cosine (to 0) or constant.", choices=SCHEDULES
    )
    weight_decay: float = _option(0.0, "AdamW weight decay (TRL's SFT default: 0).", ge=0)
    max_grad_norm: float = _option(1.0, "Clip the gradient norm to this; 0 = no clipping.", ge=0)
    val_fraction: float = _option(
        0.1, "Share of the seeds held out for the validation loss.", ge=0, lt=1
    )
    seed: int = _option(0, "Seed of the split, the shuffling and torch.")
    # bf16 autocast keeps fp32 master weights and optimizer state; on a CPU with native
    # bf16 (AVX512-BF16/AMX) its matmuls are ~4x faster, a whole SFT step ~1.7x.
    dtype: str = _option(
        "auto",
        "Compute dtype: auto (bf16 on CUDA and on a CPU with native bf16, else fp32), "
        "fp32 or bf16 (autocast).",
        choices=DTYPES,
    )

    @model_validator(mode="before")
    @classmethod
    def _flags(cls, values: Any) -> Any:
        """A one-line UserError naming the flag (`--lr`) of the first option outside its
        rules: the options arrive as `starpo sft`'s flags."""
        if isinstance(values, dict):
            check_settings(values, spell=lambda name: "--" + name.replace("_", "-"), settings=cls)
        return values
