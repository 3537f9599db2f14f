"""Supervised fine-tuning on agent trajectories, laid out exactly as RL rollouts.

Records (`starpo eval` / `starpo train` trajectories, or solver episodes) are replayed
through the rollout engine with a scripted backend (`replay`), so an SFT example holds the
very prompts, chunks and turn ends an RL rollout would; the model then learns the agent's
tokens by NLL (`train`). `run_sft` is the recipe; `starpo sft` its command (`command`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["TrainOptions", "replay_records", "run_sft"]


def __getattr__(name: str) -> Any:
    """Import on first use: the training half needs torch, `starpo --help` does not."""
    if name == "run_sft":
        from starpo.sft.run import run_sft

        return run_sft
    if name == "TrainOptions":
        from starpo.sft.options import TrainOptions

        return TrainOptions
    if name == "replay_records":
        from starpo.sft.replay import replay_records

        return replay_records
    raise AttributeError(f"module 'starpo.sft' has no attribute {name!r}")
