"""Play episodes with a policy on fixed seeds and summarise them (`starpo eval`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from starpo.envs import TextEnv, make
from starpo.envs.policies import Policy, has_solver, make_policy
from starpo.types import EnvStep, Episode

#: First validation seed; validation seeds are fixed so runs compare on the same states.
VALIDATION_SEED_START = 123


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
) -> Iterator[Episode]:
    """Episodes on seeds seed_start, seed_start + 1, ... (one env, one policy).

    The env and policy are built before returning, so bad input fails before any episode.
    """
    env = make(env_id, **(env_kwargs or {}))
    policy = make_policy(policy_name, seed=seed_start)
    seeds = range(seed_start, seed_start + num_episodes)
    return (
        run_episode(env, policy, seed=seed, env_id=env_id, policy_name=policy_name)
        for seed in seeds
    )


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (sound at 0% and 100%, unlike Wald)."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarise(episodes: list[Episode]) -> dict[str, Any]:
    """Success rate with its 95% interval, rewards, action counts and validity."""
    n = len(episodes)
    successes = sum(e.success for e in episodes)
    actions = [s for e in episodes for s in e.steps]
    optimal = [e.optimal_success_prob for e in episodes if e.optimal_success_prob is not None]
    low, high = wilson_interval(successes, n)
    return {
        "num_episodes": n,
        "success_rate": successes / n if n else 0.0,
        "success_rate_ci95": [low, high],
        "mean_reward": sum(e.total_reward for e in episodes) / n if n else 0.0,
        "mean_actions": len(actions) / n if n else 0.0,
        "valid_action_rate": sum(s.action_is_valid for s in actions) / len(actions)
        if actions
        else 0.0,
        "effective_action_rate": (
            sum(s.action_is_effective for s in actions) / len(actions) if actions else 0.0
        ),
        "optimal_success_rate": sum(optimal) / len(optimal) if optimal else None,
    }


def write_results(out_dir: Path, episodes: list[Episode], summary: dict[str, Any]) -> None:
    """`out_dir/trajectories.jsonl` (one episode a line) and `out_dir/summary.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "trajectories.jsonl", "w", encoding="utf-8") as f:
        for episode in episodes:
            f.write(episode.to_json() + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
