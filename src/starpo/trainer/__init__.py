"""The StarPO trainer: rollout, filter, advantages, update, log, validate, checkpoint.

from starpo.config import load_config
from starpo.trainer import Trainer

cfg = load_config("configs/cpu-bandit-starpo-s.yaml", ["trainer.total_steps=10"])
Trainer(cfg, "runs/demo").train()
"""

from __future__ import annotations

from starpo.trainer.loop import Trainer

__all__ = ["Trainer"]
