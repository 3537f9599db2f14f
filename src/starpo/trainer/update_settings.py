"""What the update stage (`prepare`, `update`) reads of the training config: the algorithm
and optim sections, and the sampling temperature its log-probs are taken at. Passing this
instead of the whole `TrainConfig` says so in every signature."""

from __future__ import annotations

from dataclasses import dataclass

from starpo.config import AlgorithmConfig, OptimConfig, TrainConfig


@dataclass(frozen=True)
class UpdateSettings:
    algorithm: AlgorithmConfig
    optim: OptimConfig
    # rollout.temperature: log-probs of the distribution the rollout sampled from
    temperature: float

    @classmethod
    def of(cls, cfg: TrainConfig) -> UpdateSettings:
        return cls(cfg.algorithm, cfg.optim, cfg.rollout.temperature)
