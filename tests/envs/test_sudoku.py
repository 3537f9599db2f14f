"""Sudoku env: generated puzzles have one solution, placements are parsed and rewarded as
documented, the solver finishes every puzzle, and every rationale states true facts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.envs import check_env, make
from starpo.envs.policies import make_policy
from starpo.envs.sudoku.env import SudokuEnv, box_name, parse_puzzle
from starpo.envs.sudoku.puzzles import (
    MAX_BLANKS,
    candidates,
    count_solutions,
    digits_of,
    geometry,
    is_consistent,
    make_puzzle,
    random_full_grid,
)
from starpo.errors import UserError

# Solution 1234/3412/2143/4321 with r1c1, r1c2, r1c3, r2c1 and r4c3 blank: its wrong
# placements show all four kinds of feedback.
PUZZLE = "...4 .412 2143 43.1"
PUZZLE_RENDER = """\
    1 2   3 4
r1  . . | . 4
r2  . 4 | 1 2
    ----+----
r3  2 1 | 4 3
r4  4 3 | . 1"""
CONFIGS = [{}, {"num_blanks": 12}, {"size": 9}, {"size": 9, "num_blanks": 55}]


def play(env: SudokuEnv, actions: list[str]) -> list[tuple]:
    return [env.step(a)[1:] for a in actions]


def units_of(size: int, cell: int) -> dict[str, tuple[int, ...]]:
    geo = geometry(size)
    r, c, b = geo.rcb[cell]
    return {"row": geo.rows[r], "column": geo.cols[c], "box": geo.boxes[b]}


# ------------------------------------------------------------------------- generation
@pytest.mark.parametrize(("size", "seeds", "distinct"), [(4, 3000, 288), (9, 300, 300)])
def test_full_grids_are_valid_and_varied(size, seeds, distinct):
    grids = {tuple(random_full_grid(np.random.default_rng(s), size)) for s in range(seeds)}
    assert all(is_consistent(g, size) and 0 not in g for g in grids)
    assert len(grids) == distinct  # every one of the 288 4x4 grids; no 9x9 grid twice


@pytest.mark.parametrize(
    ("size", "blanks", "seeds"), [(4, 6, 300), (4, 12, 60), (9, 30, 20), (9, 55, 5)]
)
def test_puzzles_have_the_blanks_asked_for_and_one_solution(size, blanks, seeds):
    for seed in range(seeds):
        puzzle, solution = make_puzzle(np.random.default_rng(seed), size, blanks)
        assert puzzle.count(0) == blanks and count_solutions(puzzle, size, limit=5) == 1
        assert all(p in (0, s) for p, s in zip(puzzle, solution, strict=True))
        assert is_consistent(solution, size) and 0 not in solution


def test_same_seed_same_episode_and_seeds_vary():
    a, b = make("sudoku"), make("sudoku")
    puzzles = set()
    for seed in range(50):
        assert a.reset(seed=seed) == b.reset(seed=seed) and a.snapshot() == b.snapshot()
        policy_a, policy_b = make_policy("random", seed), make_policy("random", seed)
        while not a.done:
            assert a.step(policy_a(a)) == b.step(policy_b(b))
        puzzles.add(b.snapshot().puzzle)
    assert len(puzzles) == 50


def test_an_impossible_blank_count_is_a_user_error():
    with pytest.raises(UserError, match="use fewer blanks"):
        make_puzzle(np.random.default_rng(0), 4, 15, max_tries=3)


# ------------------------------------------------------------------- rules and rewards
def test_render_and_a_full_episode_with_hand_computed_rewards():
    env = SudokuEnv()
    obs, info = env.reset(options={"puzzle": PUZZLE})
    assert obs == PUZZLE_RENDER and info["num_blanks"] == 5 and env.steps_left == 10
    obs, reward, terminated, truncated, info = env.step("r1c1=4")
    assert (reward, terminated, truncated) == (-0.1, False, False)
    assert obs == PUZZLE_RENDER + "\nr1c1=4 is wrong: row 1 already has a 4. The cell stays empty."
    assert (info["action"], info["correct"], info["action_is_effective"]) == (
        "r1c1=4",
        False,
        False,
    )
    assert env.steps_left == 9 and env.blanks_left == 5 and env.mistakes == 1
    obs, reward, *_, info = env.step("R1C2 = 2")
    assert reward == 0.1 and info["action_is_effective"] and env.blanks_left == 4
    assert obs.splitlines()[1] == "r1  . 2 | . 4" and obs.endswith("r1c2=2 is correct.")
    rewards = [step[0] for step in play(env, ["r1c1=1", "(1,3)=3", "r2 c1=3"])]
    assert rewards == [0.1, 0.1, 0.1] and not env.done
    obs, reward, terminated, truncated, info = env.step("r4c3=2")
    assert (reward, terminated, truncated, info["success"]) == (1.1, True, False, True)
    assert obs.endswith("r4c3=2 is correct. The puzzle is solved.")


@pytest.mark.parametrize(
    ("action", "why"),
    [
        ("r1c1=4", "row 1 already has a 4"),
        ("r1c1=2", "column 1 already has a 2"),
        ("r1c3=2", "its box already has a 2"),
        ("r1c1=3", "no solution has a 3 there"),
    ],
)
def test_a_wrong_placement_says_why(action, why):
    env = SudokuEnv()
    env.reset(options={"puzzle": PUZZLE})
    obs, *_ = env.step(action)
    assert obs.splitlines()[-1] == f"{action} is wrong: {why}. The cell stays empty."


def test_mistakes_use_the_budget_until_the_puzzle_cannot_be_finished():
    env = SudokuEnv(max_steps=6)
    env.reset(options={"puzzle": PUZZLE})
    assert env.optimal_success_probability() == 1.0
    env.step("r1c1=4")
    assert env.optimal_success_probability() == 1.0  # 5 steps left for 5 blanks
    env.step("r1c1=4")  # the same mistake costs again
    assert env.optimal_success_probability() == 0.0 and env.optimal_action() is not None
    results = play(env, ["r1c1=1", "r1c2=2", "r1c3=3", "r2c1=3"])
    assert results[-1][1:3] == (False, True) and not env.is_success()  # truncated, 1 blank
    assert env.optimal_success_probability() == 0.0 and env.optimal_action() is None


@pytest.mark.parametrize(
    "text", ["r2c1=3", "R2C1=3", "r2 c1 = 3", "r2, c1=3", "(2,1)=3", "( 2 , 1 ) = 3", " r2c1=3\n"]
)
def test_accepted_spellings_read_as_the_canonical_placement(text):
    env = SudokuEnv()
    env.reset(options={"puzzle": PUZZLE})
    assert env.parse_action(text) == (2, 1, 3)
    assert env.step(text)[-1]["action"] == "r2c1=3"


@pytest.mark.parametrize(
    "text",
    [
        "r2c1",  # no digit
        "r2c1=",
        "2,1=3",  # no parentheses
        "c1r2=3",  # column first
        "r2c1=3.",  # trailing text
        "r2c1=3 || r1c1=1",
        "r2c1:3",
        "row 2 column 1 = 3",
        "r２c1=3",  # a full-width digit
        "r0c1=3",  # out of range
        "r5c1=3",
        "r2c1=5",
        "r2c1=0",
        "r1c4=4",  # a given cell, even with its own digit
        "r1c4=1",
        "r2c1=" + "3" * 50,
    ],
)
def test_malformed_out_of_range_or_given_placements_are_invalid_and_change_nothing(text):
    env = SudokuEnv()
    env.reset(options={"puzzle": PUZZLE})
    before = (env.render(), env.snapshot(), env.steps_left)
    obs, reward, terminated, truncated, info = env.step(text)
    assert (reward, terminated, truncated, info["action_is_valid"], info["action"]) == (
        0.0,
        False,
        False,
        False,
        None,
    )
    assert (obs, env.snapshot(), env.steps_left) == before


def test_a_filled_cell_cannot_be_overwritten():
    env = SudokuEnv()
    env.reset(options={"puzzle": PUZZLE})
    env.step("r2c1=3")
    assert env.parse_action("r2c1=3") is None and env.parse_action("r2c1=1") is None


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.one_of(st.text(max_size=20), st.from_regex(r"[rRcC(), =0-9]{1,14}", fullmatch=True)))
def test_any_text_is_judged_without_raising(text):
    env = SudokuEnv()
    env.reset(options={"puzzle": PUZZLE})
    before = env.snapshot()
    parsed = env.parse_action(text)
    *_, info = env.step(text)
    if info["action_is_valid"]:  # the label reads back as the same placement
        fresh = SudokuEnv()
        fresh.reset(options={"puzzle": PUZZLE})
        assert fresh.parse_action(info["action"]) == parsed is not None
    else:
        assert env.snapshot() == before and parsed is None


def test_sampled_actions_are_well_formed_placements_into_empty_cells():
    env = make("sudoku", size=9)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    samples = [env.sample_action(rng) for _ in range(200)]
    assert all(env.parse_action(a) is not None for a in samples)
    assert len(set(samples)) > 100


def test_the_state_key_is_the_grid_without_feedback():
    env = SudokuEnv()
    env.reset(options={"puzzle": PUZZLE})
    key = env.state_key()
    env.step("r1c1=4")
    assert env.state_key() == key == "0004041221434301"


# ------------------------------------------------------------------------ the solver
@pytest.mark.parametrize(("kwargs", "seeds"), [({}, 200), ({"size": 9}, 20)])
def test_the_solver_policy_solves_every_puzzle_without_mistakes(kwargs, seeds):
    env = make("sudoku", **kwargs)
    policy = make_policy("solver")
    for seed in range(seeds):
        env.reset(seed=seed)
        assert env.optimal_success_probability() == 1.0
        total = 0.0
        while not env.done:
            _, reward, *_ = env.step(policy(env))
            total += reward
        assert env.is_success() and env.mistakes == 0
        assert total == pytest.approx(0.1 * env.num_blanks + 1.0)


def test_random_play_ends_and_rarely_solves():
    env = make("sudoku")
    policy = make_policy("random", seed=1)
    solved = 0
    for seed in range(100):
        env.reset(seed=seed)
        steps = 0
        while not env.done:
            env.step(policy(env))
            steps += 1
        assert steps <= env.max_steps
        solved += env.is_success()
    assert solved <= 15


def test_the_first_solver_move_on_the_hand_puzzle():
    env = SudokuEnv()
    env.reset(options={"puzzle": PUZZLE})
    assert env.optimal_action() == "r1c2=2"  # the first cell where only one digit fits
    assert env.explain("r1c2=2") == (
        "Row 1, column 2 and the box of r1c2 already hold 1, 3 and 4, so only 2 fits there: r1c2=2."
    )
    assert env.explain("r1c2=4") is None and env.explain("r1c4=4") is None
    assert env.explain("nonsense") is None


def check_rationale(env: SudokuEnv, action: str, text: str) -> str:
    """Check every fact `text` states about the placement `action`; return its kind."""
    row, col, value = env.parse_action(action)
    cell, size, grid = (row - 1) * env.size + col - 1, env.size, env.grid
    assert value == env.solution[cell] and text.endswith(f"{action}.") and len(text.split()) <= 40
    units = units_of(size, cell)
    if text.startswith(f"Row {row}, column {col} and the box"):
        seen = {grid[i] for unit in units.values() for i in unit} - {0}
        listed = text.split("already hold ")[1].split(", so")[0].replace(" and", ",")
        assert {int(d) for d in listed.split(", ")} == seen == set(range(1, size + 1)) - {value}
        return "naked"
    if text.startswith("Only "):
        fits = digits_of(candidates(grid, size, cell))
        assert text.startswith(f"Only {', '.join(map(str, fits[:-1]))}")
        for other in set(fits) - {value}:
            trial = list(grid)
            trial[cell] = other
            assert count_solutions(trial, size, limit=1) == 0
        return "search"
    if " box needs a " in text:
        name = "box"
        assert text.startswith(f"The {box_name(geometry(size).rcb[cell][2], size)} box needs")
    else:
        name = "row" if text.startswith(f"Row {row} needs a {value}") else "column"
        assert name == "row" or text.startswith(f"Column {col} needs a {value}"), text
    bit = 1 << (value - 1)
    others = [i for i in units[name] if i != cell and not grid[i]]
    assert others and not any(candidates(grid, size, i) & bit for i in others)
    return "hidden"


def test_every_rationale_is_true_on_hard_9x9_puzzles():
    kinds = set()
    for seed in range(4):
        env = make("sudoku", size=9, num_blanks=55)
        env.reset(seed=seed)
        while not env.done:
            action = env.optimal_action()
            text = env.explain(action)
            assert env.explain(action.upper()) == text
            kinds.add(check_rationale(env, action, text))
            env.step(action)
        assert env.is_success()
    assert kinds == {"naked", "hidden", "search"}  # the seeds reach every kind


def test_any_correct_placement_gets_a_true_rationale():
    env = make("sudoku", size=9, num_blanks=45)
    for seed in range(3):
        env.reset(seed=seed)
        for cell in [i for i, v in enumerate(env.grid) if not v]:
            action = f"r{cell // 9 + 1}c{cell % 9 + 1}={env.solution[cell]}"
            check_rationale(env, action, env.explain(action))


def test_box_names():
    assert [box_name(b, 4) for b in range(4)] == [
        "top-left",
        "top-right",
        "bottom-left",
        "bottom-right",
    ]
    assert box_name(4, 9) == "centre" and box_name(5, 9) == "middle-right"


# ------------------------------------------------------------------ arguments, registry
@pytest.mark.parametrize("kwargs", CONFIGS)
def test_the_checker_passes(kwargs):
    assert "determinism" in check_env(SudokuEnv(**kwargs), seeds=[0, 1, 2])


def test_registered_ids():
    assert make("sudoku").size == 4 and make("sudoku").max_steps == 10
    nine = make("sudoku-9x9")
    assert (nine.size, nine.num_blanks, nine.max_steps) == (9, 30, 34)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 5}, "size must be 4 or 9"),
        ({"size": 16}, "size must be 4 or 9"),
        ({"size": True}, "size must be 4 or 9"),
        ({"size": "4"}, "size must be 4 or 9"),
        ({"num_blanks": 0}, "num_blanks must be an integer from 1 to 12"),
        ({"num_blanks": 13}, "num_blanks must be an integer from 1 to 12"),
        ({"size": 9, "num_blanks": 70}, f"from 1 to {MAX_BLANKS[9]} for size 9"),
        ({"num_blanks": 2.5}, "num_blanks must be an integer"),
        ({"num_blanks": 8, "max_steps": 7}, r"max_steps must be an integer from num_blanks \(8\)"),
        ({"max_steps": 10**6}, "max_steps must be an integer"),
        ({"max_steps": "10"}, "max_steps must be an integer"),
    ],
)
def test_bad_arguments_are_one_line_user_errors(kwargs, message):
    with pytest.raises(UserError, match=message) as error:
        SudokuEnv(**kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("puzzle", "message"),
    [
        ("1.3. 3.1. 2143 4321", "more than one solution"),
        ("11.4 3412 2143 4321", "no solution"),
        ("1234 3412 2143 4321", "no blank cell"),
        ("1.34 3412 2143", "not a 4x4 grid"),
        ("1.34 3412 2143 4325", "not a 4x4 grid"),
        (1234, "must be a string"),
    ],
)
def test_bad_puzzles_are_user_errors(puzzle, message):
    with pytest.raises(UserError, match=message):
        parse_puzzle(puzzle, 4)
    with pytest.raises(UserError, match="unknown reset options"):
        SudokuEnv().reset(options={"level": "x"})
