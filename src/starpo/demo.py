"""`make demo`: each environment played by the optimal solver and by a random agent.

Later stages replace this with training; for now it shows the envs frame by frame.
"""

from __future__ import annotations

from starpo.envs import make
from starpo.envs.policies import make_policy
from starpo.evaluation import run_episode

DEMO_ENVS = ("bandit", "bandit-rev", "frozenlake", "sokoban", "sokoban-large", "sokoban-newvocab")
DEMO_SEED = 123


def show_episode(env_id: str, policy_name: str, seed: int = DEMO_SEED) -> bool:
    """Print one episode frame by frame; return its success."""
    env = make(env_id)
    episode = run_episode(
        env, make_policy(policy_name, seed=seed), seed=seed, env_id=env_id, policy_name=policy_name
    )
    print(f"--- {env_id} | policy={policy_name} | seed={seed} ---")
    print(episode.initial_observation)
    for i, step in enumerate(episode.steps, 1):
        print(f"\naction {i}: {step.action}  reward {step.reward:+g}")
        print(step.observation)
    verdict = "SUCCESS" if episode.success else "failure"
    total = episode.total_reward
    odds = episode.optimal_success_prob
    chance = "" if odds is None else f" (an optimal policy succeeds w.p. {odds:.2f} here)"
    print(f"=> {verdict} after {episode.num_actions} actions, total reward {total:+g}{chance}\n")
    return episode.success


def main() -> None:
    results = {}
    for env_id in DEMO_ENVS:
        for policy_name in ("solver", "random"):
            results[(env_id, policy_name)] = show_episode(env_id, policy_name)
    print("summary (seed 123):")
    for (env_id, policy_name), success in results.items():
        print(f"  {env_id:<18}{policy_name:<8}{'success' if success else 'failure'}")


if __name__ == "__main__":
    main()
