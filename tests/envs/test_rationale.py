"""Env rationales (`TextEnv.explain`): short, deterministic, and every stated fact true.

Sokoban and FrozenLake texts are parsed back into facts (relative positions, hole claims)
and checked against the env's snapshot, an independent replay of the solver's plan, and the
FrozenLake transition model.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from starpo.envs import TextEnv, make, standalone_ids
from starpo.envs.bandit import BanditEnv
from starpo.envs.frozenlake.env import FrozenLakeEnv
from starpo.envs.frozenlake.solver import ACTIONS, HOLE, MOVES, transition_matrix, transitions
from starpo.envs.policies import has_rationale, has_solver
from starpo.envs.sokoban.env import SokobanEnv
from starpo.envs.sokoban.solver import DELTAS
from starpo.envs.tools import is_tool_env

SOLVER_IDS = [i for i in standalone_ids() if has_solver(make(i))]
SEEDS = range(30)
MAX_WORDS = 40
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


class Minimal(TextEnv):
    action_names = ("Go",)

    def __init__(self) -> None:
        super().__init__(max_steps=1)

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        return {}

    def _step(self, action_index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        return 1.0, True, True, {}

    def render(self) -> str:
        return "."

    def snapshot(self) -> Any:
        return ()

    def is_success(self) -> bool:
        return self.done


def test_base_env_offers_no_rationale():
    env = Minimal()
    env.reset(seed=0)
    assert env.explain("Go") is None
    assert not has_rationale(env)


def solver_episode(env_id: str, seed: int) -> Iterator[tuple[TextEnv, str, str]]:
    """(env before the move, the solver's move, its rationale) for one solver episode;
    the env yielded is the live one, so check it before the next step."""
    env = make(env_id)
    env.reset(seed=seed)
    while not env.done and (action := env.optimal_action()) is not None:
        yield env, action, env.explain(action)
        env.step(action)


@pytest.mark.parametrize("env_id", SOLVER_IDS)
def test_every_solver_move_gets_a_short_deterministic_rationale(env_id: str):
    assert has_rationale(make(env_id))
    for seed in SEEDS:
        for env, action, text in solver_episode(env_id, seed):
            assert isinstance(text, str) and text.strip(), (env_id, seed, action)
            assert len(text.split()) <= MAX_WORDS, text
            before = env.snapshot()
            if is_tool_env(env):  # the action is a JSON call: the text says why, not what
                assert env.explain(action) == text
            else:
                assert re.search(rf"(?<!\w){re.escape(action)}(?!\w)", text), text
                assert env.explain(action.upper()) == text  # matched like step(): any case
            assert env.snapshot() == before  # explaining changes nothing
            others = [a for a in env.action_names if a != action]
            assert all(env.explain(a) is None for a in others)  # no praise for other moves
            assert env.explain("Jump") is None


@pytest.mark.parametrize("env_id", SOLVER_IDS)
def test_rationales_are_the_same_for_the_same_state(env_id: str):
    first = [text for _, _, text in solver_episode(env_id, 7)]
    assert first == [text for _, _, text in solver_episode(env_id, 7)]


# ------------------------------------------------------------------------ Sokoban
TURN = "######\n#.   #\n#  $ #\n#  @ #\n######"  # optimal: Up, Right, Up, Left, Left


def test_sokoban_texts_on_a_known_level():
    env = SokobanEnv()
    env.reset(options={"level": TURN})
    texts = []
    while not env.done:
        action = env.optimal_action()
        texts.append(env.explain(action))
        env.step(action)
    assert texts == [
        "The box (X) is one row below and two columns right of its target (O), so I push it Up.",
        "The box (X) is one row above me. I walk Right to get to its right, then push it Left.",
        "The box (X) is one row above and one column left of me. "
        "I walk Up to get to its right, then push it Left.",
        "The box (X) is two columns right of its target (O), so I push it Left.",
        "The box (X) is one column right of its target (O), so pushing it Left puts it on the "
        "target. That solves the puzzle.",
    ]


def test_sokoban_newvocab_names_its_own_symbols():
    env = SokobanEnv(vocab="newvocab")
    env.reset(options={"level": TURN})
    text = env.explain("Up")
    assert "box (C)" in text and "target (G)" in text and "(X)" not in text


def parse_offset(words: str) -> tuple[int, int]:
    """ "one row above and two columns left of" -> (-1, -2)."""
    dr = dc = 0
    for count, axis, way in re.findall(r"(\w+) (row|column)s? (above|below|left|right)", words):
        n = NUMBERS[count] * (-1 if way in ("above", "left") else 1)
        dr, dc = (n, dc) if axis == "row" else (dr, n)
    return dr, dc


def follow_solver(env_id: str, seed: int, history: list[str]) -> tuple[str, tuple, tuple]:
    """Replay `history` on a fresh env, then let the solver finish while watching the first
    box that moves: (direction of its first push, where it stood, where it ends)."""
    env = make(env_id)
    env.reset(seed=seed)
    for action in history:
        env.step(action)
    push = start = box = None
    while not env.done:
        action = env.optimal_action()
        before = env.snapshot().boxes
        env.step(action)
        after = env.snapshot().boxes
        if before != after:
            (old,), (new,) = before - after, after - before
            if push is None:
                push, start, box = action, old, old
            if old == box:
                box = new
    assert env.is_success()
    return push, start, box


@pytest.mark.parametrize("env_id", ["sokoban", "sokoban-large", "sokoban-newvocab"])
def test_sokoban_stated_positions_match_the_board(env_id: str):
    pattern = re.compile(
        r"The box \((.)\) is (.+?) (me|its target \((.)\))"
        r"(?:\. I walk (\w+) to get .+, then push it (\w+)\."
        r"|, so (?:I push it|pushing it) (\w+)(?P<on> puts it on the target)?)"
    )
    for seed in SEEDS:
        history: list[str] = []
        for env, action, text in solver_episode(env_id, seed):
            state, grid = env.snapshot(), env.render().splitlines()
            push, start, end = follow_solver(env_id, seed, history)
            match = pattern.match(text)
            assert match, text
            symbol, offset, anchor, target_symbol, walk, walk_push, pushed = match.groups()[:7]
            dr, dc = parse_offset(offset)
            if anchor == "me":  # a walk towards the next box to push
                assert (state.player[0] + dr, state.player[1] + dc) == start, text
                assert walk == action and walk_push == push, text
                delta = DELTAS[env.action_index(action)]
                assert (state.player[0] + delta[0], state.player[1] + delta[1]) not in state.boxes
            else:  # a push: the box next to me, in the direction of the move
                assert pushed == action == push, text
                delta = DELTAS[env.action_index(action)]
                assert start == (state.player[0] + delta[0], state.player[1] + delta[1])
                assert (start[0] - dr, start[1] - dc) == end and end in state.targets, text
                assert grid[end[0]][end[1]] == target_symbol
                assert bool(match["on"]) == ((start[0] + delta[0], start[1] + delta[1]) == end)
            assert start in state.boxes and grid[start[0]][start[1]] == symbol, text
            if anchor != "me":
                boxes_after = (state.boxes - {start}) | {(start[0] + delta[0], start[1] + delta[1])}
                assert ("solves the puzzle" in text) == (boxes_after <= state.targets), text
            history.append(action)


# ---------------------------------------------------------------------- FrozenLake
NEIGHBOURS = {"on my left": 0, "below me": 1, "on my right": 2, "above me": 3}


def check_frozenlake_claims(env: FrozenLakeEnv, action: str, text: str) -> None:
    """Every claim in a FrozenLake rationale, checked against the transition model."""
    rows, (r, c) = env.desc, env.position
    ncol, state, a = len(rows[0]), env._state(), ACTIONS.index(action)
    is_hole = [tile == HOLE for row in rows for tile in row]
    landings = [nxt for _, nxt, _, _ in transitions(rows, env.is_slippery)[state][a]]

    def neighbour(direction: int) -> int:
        nr, nc = r + MOVES[direction][0], c + MOVES[direction][1]
        inside = 0 <= nr < len(rows) and 0 <= nc < ncol
        return nr * ncol + nc if inside else state

    goal = next((i for i, row in enumerate(rows) if "G" in row))
    goal_col = rows[goal].index("G")
    first = text.split(".")[0].split()
    assert first[:4] == ["The", "goal", "(G)", "is"], text
    assert ("down" in first) == (goal > r) and ("up" in first) == (goal < r), text
    assert ("to the right" in text) == (goal_col > c) and ("to the left" in text) == (goal_col < c)
    assert ("straight" in text) == (goal_col == c)
    if "cannot slip into" in text or "does not step into" in text:
        assert not any(is_hole[s] for s in landings), text
    if "could end in a hole" in text:
        assert is_hole[neighbour(a)], text
    for slip in re.findall(r"could slip ((?:\w+(?: or )?)+) into a hole", text):
        for name in slip.split(" or "):
            d = ACTIONS.index(name)
            assert d != a and d != (a + 2) % 4 and is_hole[neighbour(d)], text
    for words, d in NEIGHBOURS.items():  # a named neighbouring hole is one
        if words in text:
            assert is_hole[neighbour(d)], text
    assert ("bumps the edge" in text) == (env.is_slippery and neighbour(a) == state)
    if "no other move gives a better chance" in text:
        assert any(is_hole[s] for s in landings)
        success = env._solve().success_prob
        q = transition_matrix(rows, env.is_slippery)[state] @ success[env.steps_left - 1]
        assert q[a] >= q.max() - 1e-12, text


@pytest.mark.parametrize("slippery", [True, False])
def test_frozenlake_claims_are_true(slippery: bool):
    claims = set()
    for seed in range(60):
        env = make("frozenlake", is_slippery=slippery)
        env.reset(seed=seed)
        while not env.done and (action := env.optimal_action()) is not None:
            text = env.explain(action)
            check_frozenlake_claims(env, action, text)
            claims.add(re.sub(r"^.*?\. Moving \w+ ", "", text).split(" ")[0])
            env.step(action)
    # the seeds reach the interesting cases, not just the easy one
    expected = {"bumps", "cannot", "could"} if slippery else {"does"}
    assert expected <= claims


def test_frozenlake_text_on_a_known_map():
    env = FrozenLakeEnv(desc=["SHF", "FFF", "FFG"])
    env.reset(seed=0)
    # Down or Up could slip Right into the hole; Left bumps the edge and can only slip Down.
    assert env.optimal_action() == "Left"
    assert env.explain("Left") == (
        "The goal (G) is down and to the right. Moving Left bumps the edge, so I stay or slip "
        "Down; it cannot slip into the hole on my right."
    )


# -------------------------------------------------------------------------- Bandit
@pytest.mark.parametrize(
    ("env_id", "risky", "safe"),
    [("bandit", "Dragon", "Phoenix"), ("bandit-rev", "Librarian", "Trader")],
)
def test_bandit_names_the_better_arm(env_id: str, risky: str, safe: str):
    env = make(env_id)
    env.reset(seed=3)
    assert env.explain(risky) == (
        f"{risky} is the risky arm, but it pays more on average than {safe}, so I pull {risky}."
    )
    assert env.explain(safe) is None
    env.step(risky)
    assert env.explain(risky) is None  # the single pull is used


def test_bandit_rationale_follows_the_rewards():
    env = BanditEnv(low_risk_reward=0.5)  # the safe arm pays more now
    env.reset(seed=0)
    assert env.explain("Phoenix") == (
        "Phoenix is the safe arm, and it pays more on average than Dragon, so I pull Phoenix."
    )
    tie = BanditEnv(low_risk_reward=0.25)
    tie.reset(seed=0)
    assert "as much as Phoenix" in tie.explain("Dragon")
    assert np.isclose(tie.expected_reward("Dragon"), tie.expected_reward("Phoenix"))
