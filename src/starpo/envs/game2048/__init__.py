"""2048: slide and merge tiles. `env`: the env (`Game2048Env`); `solver`."""

from starpo.envs.game2048.env import Game2048Env

__all__ = ["Game2048Env"]
