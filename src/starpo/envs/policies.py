"""Reference policies that need no model: `random`, `solver` (optimal play) and `weak` (the
solver's move only some of the time).

A policy maps the env's current state to an action name; it may read the env itself,
since these are baselines, not agents (an LLM policy sees only the text).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from starpo.defaults import WEAK_SKILL
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


def check_skill(skill: float) -> float:
    """`skill` when it is a share in [0, 1]; a UserError naming --weak-skill otherwise."""
    if not (isinstance(skill, (int, float)) and 0.0 <= skill <= 1.0):
        raise UserError(f"--weak-skill must be a share between 0 and 1, got {skill!r}")
    return float(skill)


def weak_policy(seed: int = 0, skill: float = WEAK_SKILL) -> Policy:
    """A deliberately weak player: the solver's move with probability `skill`, else a
    uniformly random one. Its episodes make a warm start that writes well-formed turns and
    leans towards good moves without solving (SFT learns a blur of the two), which RL can
    sharpen; `skill` 0 is the random policy, 1 the solver."""
    skill = check_skill(skill)
    rng = np.random.default_rng(seed)

    def act(env: TextEnv) -> str:
        if rng.random() < skill:
            action = env.optimal_action()
            if action is not None:
                return action
        return env.sample_action(rng)

    return act


POLICIES: dict[str, Callable[..., Policy]] = {
    "random": random_policy,
    "solver": solver_policy,
    "weak": weak_policy,
}
#: The policies that ask the env's solver (the env must implement it).
NEEDS_SOLVER = ("solver", "weak")


def make_policy(name: str, seed: int = 0, *, weak_skill: float = WEAK_SKILL) -> Policy:
    """Build a reference policy by name (`weak_skill`: the weak policy's share of solver
    moves; the others ignore it)."""
    if name not in POLICIES:
        raise UserError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    if name == "weak":
        return weak_policy(seed, weak_skill)
    return POLICIES[name](seed)


def has_solver(env: TextEnv) -> bool:
    """Whether the env implements the optional solver hooks."""
    return type(env).optimal_action is not TextEnv.optimal_action


def has_rationale(env: TextEnv) -> bool:
    """Whether the env implements the optional `explain` hook (rationales for moves)."""
    return type(env).explain is not TextEnv.explain
