"""FrozenLake as a finite MDP: map geometry, the transition model, and exact value iteration.

Pure functions on a map (`desc`), written with Gymnasium's letters: `S` start, `F` frozen,
`H` hole, `G` goal. A map may be a sequence of strings or a 2-D numpy array of one-letter
`str`/`bytes` cells (Gymnasium's `env.unwrapped.desc`). States are numbered row-major,
`s = row * ncol + col`; actions follow Gymnasium FrozenLake-v1: 0 Left, 1 Down, 2 Right, 3 Up.

The env (`env.py`) moves its player with `next_position` and `slip_directions`, so the
env and this model share one definition of a move. Because the only reward is +1 on reaching
the goal, "expected return within t steps" and "probability of reaching the goal within t
steps" are the same number; `solve` computes it exactly for every state and steps-left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

#: Action names in Gymnasium's order (index = action id).
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
#: (row delta, column delta) of each action.
MOVES: tuple[tuple[int, int], ...] = ((0, -1), (1, 0), (0, 1), (-1, 0))
#: Tile letters: start, frozen, hole, goal.
START, FROZEN, HOLE, GOAL = "S", "F", "H", "G"
#: Policy entry for states where no action is taken (terminal tiles, or no steps left).
NO_ACTION = -1

Position = tuple[int, int]


# ------------------------------------------------------------------------ map geometry
def as_rows(desc: Sequence[str] | np.ndarray | Any) -> tuple[str, ...]:
    """The map as a tuple of row strings (accepts strings or a 2-D array of str/bytes cells).

    Only normalises; the env validates letters and start/goal counts (with fix-it messages).
    """
    if isinstance(desc, np.ndarray):
        if desc.ndim != 2:
            raise ValueError(f"a map array must be 2-D, got shape {desc.shape}")
        return tuple(
            "".join(c.decode() if isinstance(c, bytes) else str(c) for c in row) for row in desc
        )
    rows = tuple(desc)
    if not rows or any(not isinstance(row, str) for row in rows):
        raise ValueError("a map must be a non-empty sequence of row strings")
    if len({len(row) for row in rows}) != 1 or not rows[0]:
        raise ValueError("a map must be rectangular with non-empty rows")
    return rows


def find_tile(rows: Sequence[str], letter: str) -> Position:
    """Position of the first `letter` tile, row-major (ValueError when there is none)."""
    for r, row in enumerate(rows):
        c = row.find(letter)
        if c >= 0:
            return r, c
    raise ValueError(f"the map has no {letter!r} tile")


def next_position(rows: Sequence[str], position: Position, direction: int) -> Position:
    """Where one move in `direction` leads; moving off the grid leaves the player in place."""
    dr, dc = MOVES[direction]
    r, c = position[0] + dr, position[1] + dc
    if 0 <= r < len(rows) and 0 <= c < len(rows[0]):
        return r, c
    return position


def slip_directions(action: int, is_slippery: bool) -> tuple[int, ...]:
    """The equally likely actual directions of `action`.

    Slippery ice (Gymnasium FrozenLake-v1): the intended direction or either perpendicular
    one, 1/3 each, never the opposite; in Gymnasium's action order the perpendiculars are
    the neighbours `action - 1` and `action + 1` (mod 4).
    """
    if not is_slippery:
        return (action,)
    return ((action - 1) % 4, action, (action + 1) % 4)


def shortest_path_length(desc: Sequence[str] | np.ndarray) -> int | None:
    """Fewest moves from S to G over non-hole tiles (4-neighbour BFS); None if unreachable."""
    rows = as_rows(desc)
    start, goal = find_tile(rows, START), find_tile(rows, GOAL)
    distance = {start: 0}
    frontier = deque([start])
    while frontier:
        position = frontier.popleft()
        if position == goal:
            return distance[position]
        for direction in range(len(MOVES)):
            nxt = next_position(rows, position, direction)
            if nxt not in distance and rows[nxt[0]][nxt[1]] != HOLE:
                distance[nxt] = distance[position] + 1
                frontier.append(nxt)
    return None


# --------------------------------------------------------------------- transition model
Transition = tuple[float, int, float, bool]  # (probability, next state, reward, terminal)


def transitions(
    desc: Sequence[str] | np.ndarray, is_slippery: bool = True
) -> list[list[list[Transition]]]:
    """The model in Gymnasium's layout: `P[s][a] = [(prob, next_state, reward, terminal)]`.

    Outcomes that land on the same tile are merged (e.g. two slips into a wall both leave
    the player in place: one entry with probability 2/3). Hole and goal tiles are absorbing:
    every action there stays put with reward 0, as in Gymnasium.
    """
    rows = as_rows(desc)
    ncol = len(rows[0])
    model: list[list[list[Transition]]] = []
    for r, row in enumerate(rows):
        for c, tile in enumerate(row):
            s = r * ncol + c
            if tile in (HOLE, GOAL):
                model.append([[(1.0, s, 0.0, True)] for _ in ACTIONS])
                continue
            per_action = []
            for action in range(len(ACTIONS)):
                outcomes: dict[int, float] = {}
                directions = slip_directions(action, is_slippery)
                for direction in directions:
                    nr, nc = next_position(rows, (r, c), direction)
                    nxt = nr * ncol + nc
                    outcomes[nxt] = outcomes.get(nxt, 0.0) + 1.0 / len(directions)
                per_action.append([_outcome(rows, ncol, nxt, p) for nxt, p in outcomes.items()])
            model.append(per_action)
    return model


def _outcome(rows: Sequence[str], ncol: int, nxt: int, prob: float) -> Transition:
    tile = rows[nxt // ncol][nxt % ncol]
    return (prob, nxt, 1.0 if tile == GOAL else 0.0, tile in (HOLE, GOAL))


def transition_matrix(desc: Sequence[str] | np.ndarray, is_slippery: bool = True) -> np.ndarray:
    """The model as a dense array `T[s, a, s']` of shape (n_states, 4, n_states)."""
    model = transitions(desc, is_slippery)
    n_states = len(model)
    matrix = np.zeros((n_states, len(ACTIONS), n_states))
    for s, per_action in enumerate(model):
        for a, outcomes in enumerate(per_action):
            for prob, nxt, _, _ in outcomes:
                matrix[s, a, nxt] += prob
    return matrix


# ---------------------------------------------------------------------- value iteration
class Solution(NamedTuple):
    """Exact finite-horizon value iteration of one map, indexed `[t][s]` with `t` = steps
    left: `policy` (horizon + 1, S), `success_prob` (horizon + 1, S) and `best` (horizon + 1,
    S, A), every action tied for the policy's choice (all False where `policy` is
    NO_ACTION)."""

    policy: np.ndarray
    success_prob: np.ndarray
    best: np.ndarray


def solve(
    desc: Sequence[str] | np.ndarray, horizon: int, is_slippery: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """`(policy, success_prob)` of `solve_with_ties` (see there)."""
    solution = solve_with_ties(desc, horizon, is_slippery)
    return solution.policy, solution.success_prob


def solve_with_ties(
    desc: Sequence[str] | np.ndarray, horizon: int, is_slippery: bool = True
) -> Solution:
    """Exact finite-horizon value iteration (backward induction over steps left).

        V[0][s] = 1 if s is the goal else 0
        V[t][s] = 1 on the goal, 0 in a hole, else max_a sum_s' T[s, a, s'] V[t-1][s']
        policy[t][s] = argmax_a of that sum, NO_ACTION on terminal tiles and at t = 0.

    Ties are common: with a budget to spare, a detour reaches the goal as surely as the
    direct path. They go to the quickest actions, those whose chance of arriving within
    t-2, then t-3, ... moves is highest (on dry ice: the moves along a shortest path;
    `best` keeps them all), and `policy` takes the lowest action id among those. (Lowest
    id alone made the solver walk Left whenever the budget allowed it: 48% of its moves on
    non-slippery 4x4 maps, demonstrations SFT could not learn from.)

    `success_prob[t][s]` is the exact probability that the optimal policy reaches the goal
    within `t` moves from `s` (equal to the optimal undiscounted expected return).
    """
    if not isinstance(horizon, (int, np.integer)) or horizon < 0:
        raise ValueError(f"horizon must be a non-negative integer, got {horizon!r}")
    rows = as_rows(desc)
    tiles = np.array([tile for row in rows for tile in row])
    goal, terminal = tiles == GOAL, np.isin(tiles, (HOLE, GOAL))
    matrix = transition_matrix(rows, is_slippery)  # (S, A, S)
    n_states = len(tiles)
    policy = np.full((horizon + 1, n_states), NO_ACTION, dtype=np.int64)
    success_prob = np.zeros((horizon + 1, n_states))
    success_prob[:, goal] = 1.0
    best = np.zeros((horizon + 1, *matrix.shape[:2]), dtype=bool)
    q_by_budget = []  # q_by_budget[k][s, a]: P(goal within k + 1 moves | a first)
    for t in range(1, horizon + 1):
        q_by_budget.append(matrix @ success_prob[t - 1])  # (S, A)
        success_prob[t, ~terminal] = q_by_budget[-1].max(axis=1)[~terminal]
        best[t, ~terminal] = quickest_candidates(q_by_budget[::-1])[~terminal]
        policy[t, ~terminal] = np.argmax(best[t], axis=1)[~terminal]
    for array in (policy, success_prob, best):
        array.setflags(write=False)
    return Solution(policy, success_prob, best)


def quickest_candidates(q_by_budget: Sequence[np.ndarray]) -> np.ndarray:
    """Per state (S, A), the actions best under the first budget's values, ties kept only
    where the next budget's values (fewer moves) tie as well, and so on. Mathematically
    equal values can differ in the last bits, hence the tolerance."""
    candidates = np.ones(q_by_budget[0].shape, dtype=bool)
    for q in q_by_budget:
        best = np.where(candidates, q, -np.inf).max(axis=1, keepdims=True)
        candidates &= q >= best - 1e-12
    return candidates
