"""Countdown: reach a target number with arithmetic on the given numbers.
`env`: the env (`CountdownEnv`); `solver`."""

from starpo.envs.countdown.env import CountdownEnv

__all__ = ["CountdownEnv"]
