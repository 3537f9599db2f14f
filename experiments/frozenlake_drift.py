"""Is the move drift of a format-only FrozenLake agent under GRPO pulled by the update's
expectation, or is it noise? A model-free answer for a policy that ignores the map.

    python experiments/frozenlake_drift.py                  # 16 maps x 4 tries a step
    python experiments/frozenlake_drift.py --maps 8 --tries 8

From a format-only start the trained replies drift to one move (Left or Right 50-74%)
and back while success stays at random play's level (results page, the fifth and sixth
tries). Such a start barely reads the map, so model its moves as one softmax over the
four moves, the same in every state. For that policy class the gradient of an
episode's log-probability with respect to the move logits is sum_t (onehot(a_t) - p),
and GRPO's update on the logits is that score weighted by the episode's group-normalised
advantage (starpo's own `group_normalise`), averaged per trajectory
(`seq_mean_token_mean`: each episode's score over its own turns) or per turn
(`token_mean`). A reply's other tokens are fixed text, so its choice sits in one token a
turn and the per-token averages differ from these by a constant factor.

For each marginal this plays many training steps of the same shape as a run's
(maps x tries on fresh maps each step) and prints the push on the over-represented move's
logit against the others: its mean over steps (the expected update: negative = back
towards uniform) and its spread from step to step. A mean well under the spread means a
single step's direction is mostly noise, which an optimizer such as Adam turns into
steps of full size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from starpo.algorithms.advantages import group_normalise  # noqa: E402
from starpo.envs.frozenlake.env import FrozenLakeEnv  # noqa: E402
from starpo.envs.frozenlake.solver import ACTIONS  # noqa: E402

MOVES = ACTIONS  # Left, Down, Right, Up


def play(
    env: FrozenLakeEnv, seed: int, probs: np.ndarray, rng: np.random.Generator, max_turns: int
) -> tuple[float, list[int]]:
    """One episode of map-blind moves drawn from `probs`: (success 0/1, move indices)."""
    env.reset(seed=seed)
    moves: list[int] = []
    for _ in range(max_turns):
        move = int(rng.choice(len(probs), p=probs))
        moves.append(move)
        _, _, terminated, truncated, _ = env.step(MOVES[move])
        if terminated or truncated:
            break
    return float(env.is_success()), moves


def logit_score(moves: list[int], probs: np.ndarray) -> np.ndarray:
    """d/d(logits) of sum_t log softmax(logits)[a_t] = sum_t (onehot(a_t) - probs)."""
    return np.bincount(moves, minlength=len(probs)) - len(moves) * probs


def step_push(
    episodes: list[tuple[float, list[int]]], group_size: int, probs: np.ndarray, loss_agg: str
) -> np.ndarray:
    """One training step's update direction on the move logits (ascent: + raises a move):
    GRPO advantages within each group of `group_size` consecutive episodes, then
    `seq_mean_token_mean` (per episode over its turns, then over episodes) or
    `token_mean` (over every turn of the step)."""
    rewards = torch.tensor([success for success, _ in episodes], dtype=torch.float64)
    groups = torch.arange(len(episodes)) // group_size
    advantages = group_normalise(rewards, groups).numpy()
    scores = [logit_score(moves, probs) for _, moves in episodes]
    if loss_agg == "seq_mean_token_mean":
        per_episode = [
            a * s / len(m) for a, s, (_, m) in zip(advantages, scores, episodes, strict=True)
        ]
        return np.mean(per_episode, axis=0)
    if loss_agg == "token_mean":
        turns = sum(len(moves) for _, moves in episodes)
        return sum(a * s for a, s in zip(advantages, scores, strict=True)) / turns
    raise ValueError(f"loss_agg={loss_agg!r}: use seq_mean_token_mean or token_mean")


def favoured_push(
    probs: np.ndarray,
    maps: int,
    tries: int,
    steps: int,
    loss_agg: str,
    max_turns: int = 10,
    seed: int = 0,
) -> np.ndarray:
    """(steps,) pushes on the most probable move's logit minus the others' mean, one per
    step of `maps` fresh non-slippery maps x `tries` episodes each."""
    env = FrozenLakeEnv(is_slippery=False)
    rng = np.random.default_rng(seed)
    favoured = int(np.argmax(probs))
    others = [i for i in range(len(probs)) if i != favoured]
    pushes = []
    for step in range(steps):
        first_map = 100_000 + seed * 1_000_000 + step * maps  # fresh maps every step
        episodes = [
            play(env, first_map + m, probs, rng, max_turns)
            for m in range(maps)
            for _ in range(tries)
        ]
        push = step_push(episodes, tries, probs, loss_agg)
        pushes.append(push[favoured] - push[others].mean())
    return np.array(pushes)


def tilted(share: float, favoured: int = 0, n: int = 4) -> np.ndarray:
    """A marginal giving `share` to move `favoured` and the rest evenly to the others."""
    probs = np.full(n, (1 - share) / (n - 1))
    probs[favoured] = share
    return probs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--maps", type=int, default=16, help="maps (groups) a step")
    parser.add_argument("--tries", type=int, default=4, help="episodes a map (group size)")
    parser.add_argument("--steps", type=int, default=150, help="training steps simulated")
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument(
        "--shares",
        type=float,
        nargs="+",
        default=[0.25, 0.4, 0.6],
        help="the favoured move's share (0.25: uniform, a control)",
    )
    args = parser.parse_args(argv)
    if min(args.maps, args.steps, args.max_turns) < 1 or args.tries < 2:
        parser.error("--maps, --steps and --max-turns must be >= 1 and --tries >= 2 (a group)")
    if not all(0.25 <= share < 1 for share in args.shares):
        parser.error("--shares must lie in [0.25, 1): the favoured move's share of four")
    print(
        f"non-slippery FrozenLake, {args.maps} maps x {args.tries} tries a step, "
        f"{args.steps} steps, map-blind policy; push on the favoured move ({MOVES[0]}) "
        "against the others"
    )
    print("| marginal | loss_agg | mean push a step | spread (std) | mean / spread |")
    print("|---|---|---|---|---|")
    for share in args.shares:
        for loss_agg in ("seq_mean_token_mean", "token_mean"):
            pushes = favoured_push(
                tilted(share), args.maps, args.tries, args.steps, loss_agg, args.max_turns
            )
            mean, spread = pushes.mean(), pushes.std(ddof=1)
            ratio = f"{mean / spread:+.2f}" if spread > 0 else "n/a (no reward spread)"
            print(f"| {MOVES[0]} {share:.0%} | {loss_agg} | {mean:+.4f} | {spread:.4f} | {ratio} |")


if __name__ == "__main__":
    main()
