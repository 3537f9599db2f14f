"""Scripted policies (random, solver, weak) play an env on fixed seeds: the baselines every
model is compared against (`starpo eval --policy random`), and SFT's solver, random and weak
episodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from starpo.defaults import VALIDATION_SEED_START, WEAK_SKILL
from starpo.envs import TextEnv, make
from starpo.envs.policies import NEEDS_SOLVER, Policy, has_solver, make_policy
from starpo.errors import UserError
from starpo.types import EnvStep, Episode


def run_episode(
    env: TextEnv, policy: Policy, *, seed: int, env_id: str, policy_name: str
) -> Episode:
    """Reset `env` with `seed` and let `policy` act until the episode ends."""
    obs, _ = env.reset(seed=seed)
    optimal = env.optimal_success_probability() if has_solver(env) else None
    episode = Episode(
        env_id=env_id,
        seed=seed,
        policy=policy_name,
        initial_observation=obs,
        optimal_success_prob=optimal,
    )
    # Every valid action uses budget, so max_steps valid actions end the episode; the bound
    # catches a policy that keeps answering with invalid actions.
    for _ in range(10 * env.max_steps + 10):
        action = policy(env)
        obs, reward, terminated, truncated, info = env.step(action)
        episode.steps.append(
            EnvStep(
                action=action,
                observation=obs,
                reward=reward,
                terminated=terminated,
                truncated=truncated,
                action_is_valid=info["action_is_valid"],
                action_is_effective=info["action_is_effective"],
                action_is_optimal=info.get("action_is_optimal"),
                tool_result=info.get("tool_result"),
            )
        )
        episode.success = bool(info["success"])
        if terminated or truncated:
            return episode
    raise RuntimeError(f"policy {policy_name!r} kept choosing invalid actions on {env_id!r}")


def play_episodes(
    env_id: str,
    policy_name: str,
    num_episodes: int,
    *,
    seed_start: int = VALIDATION_SEED_START,
    env_kwargs: dict[str, Any] | None = None,
    weak_skill: float = WEAK_SKILL,
) -> Iterator[Episode]:
    """Episodes on seeds seed_start, seed_start + 1, ... (one env, one policy; `weak_skill`:
    the weak policy's share of solver moves).

    The env and policy are built before returning, so bad input fails before any episode.
    """
    policy = make_policy(policy_name, seed=seed_start, weak_skill=weak_skill)
    env = make(env_id, **(env_kwargs or {}))
    if policy_name in NEEDS_SOLVER and not has_solver(env):
        env.close()
        raise UserError(
            f"policy {policy_name!r} plays the env's solver and {env_id!r} has none; use "
            f"--policy random, or an env with a solver (`starpo envs`)"
        )
    seeds = range(seed_start, seed_start + num_episodes)

    def episodes() -> Iterator[Episode]:
        try:
            for seed in seeds:
                yield run_episode(env, policy, seed=seed, env_id=env_id, policy_name=policy_name)
        finally:
            env.close()  # a remote env's session ends with the last episode

    return episodes()
