"""FrozenLake: walk a frozen grid to the goal without falling into a hole.
`env`: the env (`FrozenLakeEnv`); `solver`."""

from starpo.envs.frozenlake.env import FrozenLakeEnv

__all__ = ["FrozenLakeEnv"]
