"""Is a FrozenLake policy's success its move marginal or its map reading? The success a
policy that ignores the map would have with the same mix of moves.

    python experiments/frozenlake_blind_marginal.py runs/fl-levers-rft3-s1/rl-grpo-eval

An RL run can raise success by leaning to the moves that happen to pay on the map
distribution (the goal is more often up and right of the start, say) without reading each
map. This counts the moves an evaluation's episodes made (every action of every turn,
from `trajectories.jsonl`), then plays a blind policy that draws each move from that mix,
whatever the map, on the same seeds (non-slippery maps, the env's default size and move
budget, `--samples` episodes a seed), and prints both successes beside the uniform random
policy's. Success above the blind mix's means the moves depend on the map.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

from starpo.envs.frozenlake.env import ACTIONS, FrozenLakeEnv


def move_mix(trajectories: list[dict]) -> dict[str, float]:
    """Each action's share of all actions the episodes took (only the env's own actions)."""
    counts = Counter(
        action
        for trajectory in trajectories
        for turn in trajectory["turns"]
        for action in turn.get("actions", [])
        if action in ACTIONS
    )
    total = sum(counts.values())
    if not total:
        raise ValueError("the episodes took no FrozenLake action")
    return {action: counts[action] / total for action in ACTIONS}


def blind_success(mix: dict[str, float], seeds: list[int], samples: int, seed: int = 0) -> float:
    """The success of drawing every move from `mix`, whatever the map, on dry ice."""
    rng = random.Random(seed)
    actions, weights = list(mix), list(mix.values())
    env = FrozenLakeEnv(is_slippery=False)
    wins = 0
    for map_seed in seeds:
        for _ in range(samples):
            env.reset(seed=map_seed)
            done, info = False, {}
            while not done:
                _, _, terminated, truncated, info = env.step(rng.choices(actions, weights)[0])
                done = terminated or truncated
            wins += bool(info.get("success"))
    return wins / (len(seeds) * samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evaluation", type=Path, help="a folder with trajectories.jsonl")
    parser.add_argument("--samples", type=int, default=20, help="blind episodes a seed")
    args = parser.parse_args()
    path = args.evaluation / "trajectories.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist: give an evaluation's folder")
    trajectories = [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
    seeds = sorted({t["seed"] for t in trajectories})
    success = sum(bool(t.get("success")) for t in trajectories) / len(trajectories)
    mix = move_mix(trajectories)
    uniform = dict.fromkeys(ACTIONS, 1 / len(ACTIONS))
    print("moves: " + ", ".join(f"{a} {share:.1%}" for a, share in mix.items()))
    print(f"the policy:                        {success:.1%} on {len(trajectories)} episodes")
    print(f"blind, the policy's move mix:      {blind_success(mix, seeds, args.samples):.1%}")
    print(f"blind, uniform (random policy):    {blind_success(uniform, seeds, args.samples):.1%}")


if __name__ == "__main__":
    main()
