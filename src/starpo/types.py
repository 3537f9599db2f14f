"""Records shared across modules, and their JSONL schema.

`EnvStep` / `Episode` are what any policy produces when it plays an env; the rollout engine
extends them with tokens and log-probs for training.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EnvStep:
    """One action applied to an env and what came back."""

    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    action_is_valid: bool
    action_is_effective: bool


@dataclass
class Episode:
    """A whole episode: initial observation, steps, and outcome (one JSONL line)."""

    env_id: str
    seed: int
    policy: str
    initial_observation: str
    steps: list[EnvStep] = field(default_factory=list)
    success: bool = False
    # Success probability an optimal policy has from the initial state (None: no solver).
    optimal_success_prob: float | None = None

    @property
    def total_reward(self) -> float:
        return sum(step.reward for step in self.steps)

    @property
    def num_actions(self) -> int:
        return len(self.steps)

    def to_json(self) -> str:
        record = asdict(self)
        record["total_reward"] = self.total_reward
        record["num_actions"] = self.num_actions
        return json.dumps(record, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Episode:
        record: dict[str, Any] = json.loads(line)
        record.pop("total_reward", None)
        record.pop("num_actions", None)
        record["steps"] = [EnvStep(**step) for step in record.get("steps", [])]
        return cls(**record)
