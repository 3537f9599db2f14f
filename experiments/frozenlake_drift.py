"""Is the move drift of a format-only FrozenLake agent under GRPO pulled by the update's
expectation, or is it noise? And how strong is the pull towards reading the map? A
model-free answer.

    python experiments/frozenlake_drift.py                  # 16 maps x 4 tries a step
    python experiments/frozenlake_drift.py --maps 8 --tries 8

From a format-only start the trained replies drift to one move (Left or Right 50-74%)
and back while success stays at random play's level (results page, the fifth and sixth
tries). Model the policy as softmax(move logits + lean * good), where `good` marks the
moves one cell closer to the goal around the holes (the env's `good_actions`): lean 0 is
a policy that ignores the map, as such a start nearly does; a larger lean follows it.
The gradient of an episode's log-probability is, per turn, onehot(a_t) - p for the
logits and good[a_t] - p . good for the lean; GRPO's update is that score weighted by
the episode's group-normalised advantage (starpo's own `group_normalise`), averaged per
trajectory (`seq_mean_token_mean`: each episode's score over its own turns) or per turn
(`token_mean`). A reply's other tokens are fixed text, so its choice sits in one token a
turn and the per-token averages differ from these by a constant factor.

This plays many training steps of a run's shape (maps x tries, fresh maps each step) and
prints, for map-blind policies tilted towards one move, the push on that move's logit
against the others, and for the uniform map-blind policy the push on the lean: its mean
over steps (the expected update; for the tilt, negative = back towards uniform) and its
spread from step to step. A mean well under the spread means one step's direction is
mostly noise, which an optimizer such as Adam turns into steps of full size; a mean
above it means every step pulls the same way. The lean is a feature handed to the
policy: a model has to build it from the grid's text before RL can pull on it.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from starpo.algorithms.advantages import group_normalise
from starpo.algorithms.losses import AGGREGATIONS, aggregate
from starpo.envs.frozenlake.env import FrozenLakeEnv
from starpo.envs.frozenlake.solver import ACTIONS

MOVES = ACTIONS  # Left, Down, Right, Up

#: One turn as the model sees it: the move drawn, and which moves were good there (one
#: cell closer to the goal around the holes, the env's `good_actions`; all zeros when the
#: goal is out of reach).
Turn = tuple[int, np.ndarray]


def good_mask(env: FrozenLakeEnv) -> np.ndarray:
    good = env.good_actions() or frozenset()
    return np.array([move in good for move in MOVES], dtype=float)


def move_probs(logits: np.ndarray, lean: float, good: np.ndarray) -> np.ndarray:
    """softmax(logits + lean * good): `lean` 0 ignores the map, larger leans to good moves."""
    z = logits + lean * good
    z = np.exp(z - z.max())
    return z / z.sum()


def play(
    env: FrozenLakeEnv,
    seed: int,
    logits: np.ndarray,
    lean: float,
    rng: np.random.Generator,
    max_turns: int,
) -> tuple[float, list[Turn]]:
    """One episode of the policy softmax(logits + lean * good): (success 0/1, turns)."""
    env.reset(seed=seed)
    turns: list[Turn] = []
    for _ in range(max_turns):
        good = good_mask(env)
        move = int(rng.choice(len(MOVES), p=move_probs(logits, lean, good)))
        turns.append((move, good))
        _, _, terminated, truncated, _ = env.step(MOVES[move])
        if terminated or truncated:
            break
    return float(env.is_success()), turns


def turn_scores(turns: list[Turn], logits: np.ndarray, lean: float) -> np.ndarray:
    """d/d(logits, lean) of each turn's log-probability, (T, 5): onehot(a) - p for the
    four logits and good[a] - p . good for the lean."""
    scores = np.zeros((len(turns), len(MOVES) + 1))
    for t, (move, good) in enumerate(turns):
        probs = move_probs(logits, lean, good)
        scores[t, move] += 1.0
        scores[t, : len(MOVES)] -= probs
        scores[t, -1] = good[move] - probs @ good
    return scores


def episode_score(turns: list[Turn], logits: np.ndarray, lean: float) -> np.ndarray:
    """d/d(logits, lean) of the episode's log-probability, (5,)."""
    return turn_scores(turns, logits, lean).sum(axis=0)


def step_push(
    episodes: list[tuple[float, list[Turn]]],
    group_size: int,
    logits: np.ndarray,
    lean: float,
    loss_agg: str,
) -> np.ndarray:
    """One training step's update direction on (the four move logits, the lean), ascent:
    + raises it. GRPO advantages within each group of `group_size` consecutive episodes,
    each turn's score weighted by its episode's, then reduced by the trainer's own
    `aggregate` (`seq_mean_token_mean`: per episode over its turns, then over episodes;
    `token_mean`: over every turn of the step)."""
    if loss_agg not in AGGREGATIONS:
        raise ValueError(f"loss_agg={loss_agg!r}: use one of {', '.join(AGGREGATIONS)}")
    rewards = torch.tensor([success for success, _ in episodes], dtype=torch.float64)
    groups = torch.arange(len(episodes)) // group_size
    advantages = group_normalise(rewards, groups)
    scores = [torch.tensor(turn_scores(turns, logits, lean)) for _, turns in episodes]
    per_turn = torch.nn.utils.rnn.pad_sequence(scores, batch_first=True)  # (B, T, 5)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(s)) for s in scores], True)
    weighted = advantages[:, None, None] * per_turn
    return np.array(
        [float(aggregate(weighted[..., k], mask, loss_agg)) for k in range(per_turn.shape[-1])]
    )


def pushes(
    logits: np.ndarray,
    lean: float,
    maps: int,
    tries: int,
    steps: int,
    loss_agg: str,
    max_turns: int = 10,
    seed: int = 0,
) -> np.ndarray:
    """(steps, 5) update directions, one per step of `maps` fresh non-slippery maps x
    `tries` episodes each."""
    env = FrozenLakeEnv(is_slippery=False)
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        first_map = 100_000 + seed * 1_000_000 + step * maps  # fresh maps every step
        episodes = [
            play(env, first_map + m, logits, lean, rng, max_turns)
            for m in range(maps)
            for _ in range(tries)
        ]
        out.append(step_push(episodes, tries, logits, lean, loss_agg))
    return np.array(out)


def favoured(push: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """The push on the most probable move's logit minus the others' mean, per step."""
    top = int(np.argmax(logits))
    others = [i for i in range(len(MOVES)) if i != top]
    return push[:, top] - push[:, others].mean(axis=1)


def tilted(share: float, favoured_move: int = 0) -> np.ndarray:
    """Move logits giving `share` to move `favoured_move` and the rest evenly to the others
    (on a map the policy ignores)."""
    probs = np.full(len(MOVES), (1 - share) / (len(MOVES) - 1))
    probs[favoured_move] = share
    return np.log(probs)


def _row(label: str, loss_agg: str, values: np.ndarray) -> str:
    mean, spread = values.mean(), values.std(ddof=1)
    ratio = f"{mean / spread:+.2f}" if spread > 0 else "n/a (no reward spread)"
    return f"| {label} | {loss_agg} | {mean:+.4f} | {spread:.4f} | {ratio} |"


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
        f"{args.steps} steps; policy softmax(move logits + lean * good move)"
    )
    print("| policy | loss_agg | mean push a step | spread (std) | mean / spread |")
    print("|---|---|---|---|---|")
    aggregations = ("seq_mean_token_mean", "token_mean")
    for share in args.shares:  # map-blind (lean 0): the push on the favoured move's logit
        for loss_agg in aggregations:
            logits = tilted(share)
            push = pushes(logits, 0.0, args.maps, args.tries, args.steps, loss_agg, args.max_turns)
            print(
                _row(
                    f"{MOVES[0]} {share:.0%}, lean 0: push on {MOVES[0]}",
                    loss_agg,
                    favoured(push, logits),
                )
            )
    for loss_agg in aggregations:  # uniform, map-blind: the push on the lean
        push = pushes(
            tilted(0.25), 0.0, args.maps, args.tries, args.steps, loss_agg, args.max_turns
        )
        print(_row("uniform, lean 0: push on the lean", loss_agg, push[:, -1]))


if __name__ == "__main__":
    main()
