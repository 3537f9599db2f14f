"""Reference policies that need no model: `random` and `solver` (optimal play).

A policy maps the env's current state to an action name; it may read the env itself,
since these are baselines, not agents (an LLM policy sees only the text).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from starpo.envs.base import TextEnv
from starpo.errors import UserError

Policy = Callable[[TextEnv], str]


def random_policy(seed: int = 0) -> Policy:
    """Uniformly random action names (a free-text env's own random answers), from a
    generator of its own."""
    rng = np.random.default_rng(seed)

    def act(env: TextEnv) -> str:
        return env.sample_action(rng)

    return act


def solver_policy(seed: int = 0) -> Policy:
    """The env's optimal action; when no action helps any more, the first action name (a
    free-text env's sampled answer, drawn from `seed`)."""
    rng = np.random.default_rng(seed)

    def act(env: TextEnv) -> str:
        action = env.optimal_action()
        if action is not None:
            return action
        return env.sample_action(rng) if env.free_text else env.action_names[0]

    return act


POLICIES: dict[str, Callable[..., Policy]] = {"random": random_policy, "solver": solver_policy}


def make_policy(name: str, seed: int = 0) -> Policy:
    """Build a reference policy by name."""
    if name not in POLICIES:
        raise UserError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    return POLICIES[name](seed)


def has_solver(env: TextEnv) -> bool:
    """Whether the env implements the optional solver hooks."""
    return type(env).optimal_action is not TextEnv.optimal_action


def has_rationale(env: TextEnv) -> bool:
    """Whether the env implements the optional `explain` hook (rationales for moves)."""
    return type(env).explain is not TextEnv.explain
