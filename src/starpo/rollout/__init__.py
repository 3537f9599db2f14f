"""Multi-turn rollouts: prompts, parsing, batched generation with KV-cache reuse.

from starpo.models import load_model
from starpo.rollout import HFBackend, RolloutEngine, EpisodeSettings

model, tokenizer = load_model()
engine = RolloutEngine(HFBackend(model, pad_token_id=tokenizer.pad_token_id), tokenizer,
                       EpisodeSettings(temperature=1.0))
trajectories = engine.run("sokoban", seeds=[10000, 10001], group_size=4)
"""

from __future__ import annotations

from typing import Any

from starpo.config.episode import RolloutSettings  # the old name of EpisodeSettings
from starpo.rollout.backends.base import (
    BackendNumerics,
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from starpo.rollout.engine import EpisodeSettings, RolloutEngine
from starpo.rollout.parser import ParsedTurn, parse_turn


def __getattr__(name: str) -> Any:
    """`HFBackend` on first use only: it imports torch, which the settings, prompts and
    parser (read by the config and `starpo --help`) do not need."""
    if name == "HFBackend":
        from starpo.rollout.backends.hf import HFBackend

        return HFBackend
    raise AttributeError(f"module 'starpo.rollout' has no attribute {name!r}")


__all__ = [
    "BackendNumerics",
    "Generation",
    "GenerationBackend",
    "GenerationRequest",
    "HFBackend",
    "ParsedTurn",
    "RolloutEngine",
    "EpisodeSettings",
    "RolloutSettings",
    "SamplingParams",
    "parse_turn",
]
