"""starpo: train LLM agents with multi-turn reinforcement learning (RAGEN's StarPO / StarPO-S)."""

from __future__ import annotations

__version__ = "0.1.0"
