"""Sokoban: push boxes onto targets. `env`: the env (`SokobanEnv`); `levels`, `solver`."""

from starpo.envs.sokoban.env import SokobanEnv

__all__ = ["SokobanEnv"]
