"""Where a successful episode passed: the start states a reverse curriculum draws from.

An env with start states (`TextEnv.start_state` and the reset option `start`) can begin an
episode k moves before the end of a successful trajectory, seen by the agent as a fresh
first observation. Two sources of such trajectories:

- the env's solver (`solution_states`): play `optimal_action` from the seed's start;
- the agent's own successful episodes (`replay_states`): replay their executed actions from
  the same seed (and start), which reproduces them exactly, slips included, since an env's
  randomness comes only from its seeded generator.

Both return the states before each move, first to last: `states[-k]` lies k moves before
the end (`start_before_end`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starpo.envs.base import TextEnv


def supports_start_states(env: TextEnv) -> bool:
    """Whether `env` implements the start-state hooks (`start_state` and `_start_at`)."""
    kind = type(env)
    return kind.start_state is not TextEnv.start_state and kind._start_at is not TextEnv._start_at


def start_options(start: Any) -> dict[str, Any] | None:
    """The reset options that start a task at `start` (None: at the seed's own start)."""
    return None if start is None else {"start": start}


def solution_states(env: TextEnv, seed: int, start: Any = None) -> list[Any]:
    """The states before each move of the solver's play from the seed's start (or `start`),
    or [] when the solver does not reach success (a slippery map's slips, no solution
    within the budget)."""
    env.reset(seed=seed, options=start_options(start))
    states = []
    while not env.done:
        action = env.optimal_action()
        if action is None:
            break
        states.append(env.start_state())
        env.step(action)
    return states if env.is_success() else []


def replay_states(env: TextEnv, seed: int, start: Any, actions: Sequence[str]) -> list[Any]:
    """The states before each of `actions` (an episode's executed actions, in order) replayed
    from the seed's start (or `start`), or [] when the replay does not end in success (the
    episode was not a success, or the env is not what it was)."""
    env.reset(seed=seed, options=start_options(start))
    states = []
    for action in actions:
        if env.done:
            return []
        states.append(env.start_state())
        env.step(action)
    return states if env.is_success() else []


def start_before_end(states: Sequence[Any], moves: int) -> Any:
    """The state `moves` moves before the end of a trajectory whose states before each move
    are `states`; None (the task's own start) when `moves` covers the whole trajectory."""
    if moves < 1:
        raise ValueError(f"moves before the end must be >= 1, got {moves}")
    return None if moves >= len(states) else states[-moves]
