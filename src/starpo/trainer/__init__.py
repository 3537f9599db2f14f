"""The StarPO trainer: rollout, filter, advantages, update, log, validate, checkpoint.

from starpo.config import load_config
from starpo.trainer import Trainer

cfg = load_config("cpu-bandit-starpo-s", ["trainer.total_steps=10"])  # a preset, or a path
Trainer(cfg, "runs/demo").train()
"""

from __future__ import annotations

from starpo.trainer.loop import Trainer

__all__ = ["Trainer"]
