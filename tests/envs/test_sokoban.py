"""Sokoban env, level generator and optimal solver.

Push rules and rewards are checked on tiny hand-written XSB levels; the solver is checked
against a naive breadth-first search (no pruning) on random small boards; generated levels
are replayed with the solver's plan to success within the budget.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.envs import make
from starpo.envs.sokoban.env import SokobanEnv
from starpo.envs.sokoban.levels import format_xsb, generate_level, parse_xsb
from starpo.envs.sokoban.solver import SearchLimitExceeded, SokobanSolver, solve
from starpo.errors import UserError

SOKOBAN_IDS = ("sokoban", "sokoban-large", "sokoban-newvocab")
STANDARD_SYMBOLS = set("#_OX√PS\n")
NEWVOCAB_SYMBOLS = set("W.GCBA@\n")

ONE_PUSH = "#####\n#@$.#\n#####"
CORRIDOR = "#######\n#@ $ .#\n#######"  # optimal: Right x3
TURN = "######\n#.   #\n#  $ #\n#  @ #\n######"  # optimal: Up, Right, Up, Left, Left
TWO_BOXES = "########\n#@$ .  #\n#   $. #\n########"
CORNERED = "#####\n#$ .#\n# @ #\n#####"  # the box sits in a corner that is not a goal


def level_env(xsb: str, **kwargs) -> SokobanEnv:
    env = SokobanEnv(**kwargs)
    env.reset(options={"level": xsb})
    return env


def naive_shortest(shape, walls, targets, boxes, player, max_depth=60):
    """Plain BFS over (player, boxes) with the push rule written out again: a reference."""

    def free(cell):
        return 0 <= cell[0] < shape[0] and 0 <= cell[1] < shape[1] and cell not in walls

    start = (player, frozenset(boxes))
    if start[1] <= targets:
        return 0
    seen, frontier = {start}, [start]
    for depth in range(1, max_depth + 1):
        found = []
        for (r, c), bx in frontier:
            for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
                step = (r + dr, c + dc)
                if not free(step):
                    continue
                nb = bx
                if step in bx:
                    beyond = (step[0] + dr, step[1] + dc)
                    if not free(beyond) or beyond in bx:
                        continue
                    nb = (bx - {step}) | {beyond}
                if (step, nb) in seen:
                    continue
                if nb <= targets:
                    return depth
                seen.add((step, nb))
                found.append((step, nb))
        frontier = found
    return None


# ---------------------------------------------------------------------------- dynamics
def test_render_and_legend_standard_and_newvocab():
    env = level_env("######\n#@*$.#\n######")
    assert env.render() == "######\n#P√XO#\n######"
    assert env.legend == {
        "#": "wall", "_": "empty", "O": "target", "√": "box on target",
        "X": "box", "P": "player", "S": "player on target",
    }  # fmt: skip
    new = level_env("######\n#@*$.#\n######", vocab="newvocab")
    assert new.render() == "WWWWWW\nWABCGW\nWWWWWW"
    assert set(new.legend) == set("W.GCBA@")


@pytest.mark.parametrize(
    ("vocab", "expected"),
    [("standard", "#######\n#_SX__#\n#######"), ("newvocab", "WWWWWWW\nW.@C..W\nWWWWWWW")],
)
def test_walking_onto_a_target_shows_the_player_on_it(vocab, expected):
    env = level_env("#######\n#@.$  #\n#######", vocab=vocab)
    obs, reward, terminated, truncated, info = env.step("Right")
    assert (reward, terminated, info["action_is_effective"]) == (-0.1, False, True)
    assert obs == expected


def test_each_reward_term_of_a_push():
    env = level_env(TWO_BOXES)
    rewards = [env.step("Right")[1] for _ in range(3)]
    assert rewards == [-0.1, -0.1 + 1.0, -0.1 - 1.0]  # plain push, onto target, off target
    assert not env.is_success()


def test_solving_gives_ten_more_and_terminates():
    env = level_env(ONE_PUSH)
    obs, reward, terminated, truncated, info = env.step("right")
    assert reward == pytest.approx(10.9) and reward == env.reward_range[1]
    assert terminated and not truncated and info["success"]
    assert obs == "#####\n#_P√#\n#####"


@pytest.mark.parametrize(
    ("xsb", "action"),
    [
        ("#####\n#.@$#\n#####", "Up"),  # walk into a wall
        ("#####\n#.@$#\n#####", "Right"),  # push a box into a wall
        ("#######\n#@$$..#\n#######", "Right"),  # push a box into a box
    ],
)
def test_blocked_moves_cost_a_step_and_change_nothing(xsb, action):
    env = level_env(xsb)
    before = env.snapshot()
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (-0.1, False, False)
    assert info["action_is_valid"] and not info["action_is_effective"]
    assert env.snapshot() == before and info["steps_left"] == env.max_steps - 1


def test_invalid_action_changes_nothing():
    env = make("sokoban")
    env.reset(seed=3)
    before, obs_before = env.snapshot(), env.render()
    obs, reward, terminated, truncated, info = env.step("jump")
    assert env.snapshot() == before and obs == obs_before and hash(before) == hash(env.snapshot())
    assert (reward, terminated, truncated, info["action_is_valid"]) == (0.0, False, False, False)
    assert info["steps_left"] == env.max_steps


def test_budget_truncates():
    env = level_env(CORRIDOR, max_steps=2)
    assert env.step("Left")[3] is False
    *_, terminated, truncated, info = env.step("Left")
    assert truncated and not terminated and not info["success"]


# ------------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    "kwargs",
    [
        {"vocab": "emoji"},
        {"dim_room": (3, 6)},
        {"dim_room": 6},
        {"dim_room": (6, 6, 6)},
        {"dim_room": (6.0, 6)},
        {"num_boxes": 0},
        {"num_boxes": True},
        {"num_boxes": 3, "dim_room": (4, 4)},
        {"max_steps": 0},
        {"num_reverse_steps": 0},
        # Found by fuzzing: these generated a level for minutes or ran out of memory.
        {"max_steps": 10**9},
        {"num_gen_steps": 10**8},
        {"num_reverse_steps": 10**8},
        {"dim_room": (100, 6)},
    ],
)
def test_bad_arguments_are_user_errors(kwargs):
    with pytest.raises(UserError):
        SokobanEnv(**kwargs)


def test_vocab_error_names_the_choices():
    with pytest.raises(UserError, match="standard, newvocab"):
        make("sokoban", vocab="fancy")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("#####\n# $.#\n#####", "exactly one player"),
        ("#######\n#@@$.#\n#######", "exactly one player"),
        ("#####\n#@$ #\n#####", "as many goals as boxes"),
        ("#####\n#@  #\n#####", "as many goals as boxes"),
        ("#####\n#@x.#\n#####", "unknown symbol 'x' at row 2, column 3"),
        (123, "must be a string"),
    ],
)
def test_xsb_errors_are_one_line_user_errors(text, fragment):
    with pytest.raises(UserError, match=fragment) as caught:
        parse_xsb(text)
    assert "\n" not in str(caught.value)


def test_env_rejects_solved_levels_and_unknown_options():
    env = SokobanEnv()
    with pytest.raises(UserError, match="already solved"):
        env.reset(options={"level": "#####\n#@*#\n#####"})
    with pytest.raises(UserError, match="accepted: level"):
        env.reset(options={"map": ONE_PUSH})


def test_xsb_ragged_open_and_one_line_levels_are_closed_off():
    ragged = "  #####\n###   #\n#.@$  #\n#######"
    assert level_env(ragged).render() == "#######\n###___#\n#OPX__#\n#######"
    assert level_env("@$.").render() == "#####\n#PXO#\n#####"  # no walls: framed
    assert level_env("#####|#@$.#|#####").render() == "#####\n#PXO#\n#####"
    assert parse_xsb("-#####\n_#@$.#\n #####") == parse_xsb("######\n##@$.#\n######")


# ----------------------------------------------------------------------- generation
@pytest.mark.parametrize("env_id", SOKOBAN_IDS)
def test_same_seed_same_level_and_seeds_differ(env_id):
    levels = []
    for seed in range(30):
        a, b = make(env_id), make(env_id)
        obs_a, _ = a.reset(seed=seed)
        b.reset(seed=999)  # the earlier history of an env must not matter
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b and a.snapshot() == b.snapshot()
        levels.append(a.snapshot())
    assert len(set(levels)) >= 27


@pytest.mark.parametrize("env_id", SOKOBAN_IDS)
def test_generated_levels_replay_to_success_within_budget(env_id):
    env = make(env_id)
    allowed = NEWVOCAB_SYMBOLS if "newvocab" in env_id else STANDARD_SYMBOLS
    lengths = Counter()
    for seed in range(200):
        obs, info = env.reset(seed=10_000 + seed)
        assert not info["success"] and env.optimal_success_probability() == 1.0
        level = env.current_level()
        plan = solve(level.walls, level.targets, level.boxes, level.player)
        assert plan and len(plan) <= env.max_steps
        assert obs.count("\n") == env.dim_room[0] - 1
        seen = set(obs)
        for expected in plan:
            assert env.optimal_action() == expected  # the cached plan is the solver's plan
            obs, reward, terminated, truncated, info = env.step(expected)
            seen |= set(obs)
        assert terminated and info["success"] and reward >= 9.9
        assert seen <= allowed
        lengths[len(plan)] += 1
    assert len(lengths) >= 5  # a spread of difficulties, not one kind of level


def test_level_sizes_and_box_counts():
    for env_id, rows, boxes in (("sokoban", 6, 1), ("sokoban-large", 8, 2)):
        env = make(env_id)
        for seed in range(20):
            env.reset(seed=seed)
            level = env.current_level()
            assert level.shape == (rows, rows)
            assert len(level.boxes) == len(level.targets) == boxes
            border = {(r, c) for r in range(rows) for c in range(rows) if r in (0, rows - 1)}
            assert border <= level.walls


def test_generated_plans_are_optimal_against_naive_bfs():
    rng = np.random.default_rng(7)
    for dim, boxes in (((6, 6), 1), ((8, 8), 2)):
        for _ in range(15):
            level, plan = generate_level(rng, dim, boxes, 10)
            args = (level.shape, level.walls, level.targets, level.boxes, level.player)
            assert naive_shortest(*args, max_depth=12) == len(plan)


def test_format_xsb_round_trips():
    rng = np.random.default_rng(1)
    for _ in range(20):
        level, _ = generate_level(rng, (8, 8), 2, 10)
        assert parse_xsb(format_xsb(level)) == level


def test_impossible_rooms_raise_runtime_error():
    with pytest.raises(RuntimeError, match="larger room"):
        generate_level(np.random.default_rng(0), (4, 4), 1, 10, max_attempts=20)


# --------------------------------------------------------------------------- solver
@pytest.mark.parametrize(
    ("xsb", "plan"),
    [
        (ONE_PUSH, ["Right"]),
        (CORRIDOR, ["Right"] * 3),
        (TURN, ["Up", "Right", "Up", "Left", "Left"]),
    ],
)
def test_solver_finds_known_optimal_plans(xsb, plan):
    level = parse_xsb(xsb)
    assert solve(level.walls, level.targets, level.boxes, level.player) == plan
    args = (level.shape, level.walls, level.targets, level.boxes, level.player)
    assert naive_shortest(*args) == len(plan)


def test_solver_limits_and_dead_boxes():
    level = parse_xsb(TURN)
    solver = SokobanSolver(level.walls, level.targets, level.shape)
    assert solver.solve(level.boxes, level.player, max_depth=4) is None
    assert len(solver.solve(level.boxes, level.player, max_depth=5)) == 5
    with pytest.raises(SearchLimitExceeded):
        solver.solve(level.boxes, level.player, max_nodes=1)
    cornered = parse_xsb(CORNERED)
    assert solve(cornered.walls, cornered.targets, cornered.boxes, cornered.player) is None
    with pytest.raises(ValueError, match="on a wall"):
        solver.solve({(0, 0)}, level.player)


small_boards = st.integers(2, 6).flatmap(
    lambda rows: st.integers(2, 6).flatmap(
        lambda cols: st.tuples(
            st.just((rows, cols)),
            st.lists(st.sampled_from("#     "), min_size=rows * cols, max_size=rows * cols),
            st.integers(1, 3),
            st.randoms(use_true_random=False),
            st.none() | st.integers(0, 12),
        )
    )
)


@settings(max_examples=250, deadline=None)
@given(small_boards)
def test_solver_matches_naive_bfs_on_random_boards(board):
    shape, kinds, num_boxes, rnd, max_depth = board
    cells = [(r, c) for r in range(shape[0]) for c in range(shape[1])]
    walls = frozenset(cell for cell, kind in zip(cells, kinds, strict=True) if kind == "#")
    floor = [cell for cell in cells if cell not in walls]
    if len(floor) < num_boxes + 1:
        return
    rnd.shuffle(floor)
    player, boxes = floor[0], frozenset(floor[1 : 1 + num_boxes])
    targets = frozenset(rnd.sample(floor, num_boxes))
    plan = SokobanSolver(walls, targets, shape).solve(boxes, player, max_depth=max_depth)
    expected = naive_shortest(shape, walls, targets, boxes, player)
    if expected is not None and max_depth is not None and expected > max_depth:
        expected = None
    assert (None if plan is None else len(plan)) == expected
    if plan:  # the plan really solves the board when replayed in the env
        env = level_env(format_xsb_cells(shape, walls, targets, boxes, player), max_steps=99)
        for action in plan:
            env.step(action)
        assert env.is_success()


def format_xsb_cells(shape, walls, targets, boxes, player) -> str:
    from starpo.envs.sokoban.levels import SokobanLevel

    return format_xsb(SokobanLevel(shape, walls, targets, boxes, player))


# ----------------------------------------------------------------- env solver hooks
def test_optimal_hooks_follow_the_budget():
    env = level_env(TURN, max_steps=6)
    assert env.optimal_success_probability() == 1.0 and env.optimal_action() == "Up"
    env.step("Down")  # into the wall: 5 actions left, exactly enough
    assert env.optimal_success_probability() == 1.0
    env.step("Down")  # 4 left: no longer solvable
    assert env.optimal_success_probability() == 0.0 and env.optimal_action() is None
    cornered = level_env(CORNERED)
    assert cornered.optimal_action() is None and cornered.optimal_success_probability() == 0.0


def test_plan_is_cached_along_the_way(monkeypatch):
    env = make("sokoban-large")
    # only the solver's own moves: judging a move (good_actions) searches from its neighbours
    monkeypatch.setattr(env, "good_actions", lambda: None)
    env.reset(seed=10_001)
    calls = []
    real = SokobanSolver.solve
    monkeypatch.setattr(SokobanSolver, "solve", lambda *a, **k: calls.append(1) or real(*a, **k))
    while (action := env.optimal_action()) is not None:
        env.step(action)
    assert env.is_success() and calls == []
    env.reset(options={"level": TURN})
    env.step("Left")  # off the plan: one search from here, then cached along the new plan
    while (action := env.optimal_action()) is not None:
        env.step(action)
    assert env.is_success() and len(calls) == 1


@pytest.mark.parametrize("seed", range(10000, 10005))
def test_sokoban_coord_states_the_grid_cells_in_words(seed):
    """sokoban-coord (RAGEN-2's CoordSokoban): the grid of `sokoban`, then a line naming the
    player's, boxes' and targets' (row, column) cells, which must be where the grid draws them."""
    from starpo.envs import check_env

    coord, plain = make("sokoban-coord"), make("sokoban")
    text, _ = coord.reset(seed=seed)
    grid_text, _ = plain.reset(seed=seed)
    for action in ("Up", "Left", "Down", "Right"):
        grid, line = text.rsplit("\n", 1)
        assert grid == grid_text  # the same level, the same grid
        rows = grid.split("\n")
        player = next(
            (r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PS"
        )
        assert line.startswith(f"Player at ({player[0]}, {player[1]}); boxes at (")
        boxes = sorted(
            (r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "X√"
        )
        assert f"boxes at {', '.join(f'({r}, {c})' for r, c in boxes)};" in line
        text, *_ = coord.step(action)
        grid_text, *_ = plain.step(action)
    assert check_env(make("sokoban-coord"))  # every check passes


def test_sokoban_coordinates_flag_must_be_a_bool():
    with pytest.raises(UserError, match="coordinates must be true or false"):
        make("sokoban", coordinates="yes")


@pytest.mark.parametrize("seed", range(10000, 10020))
def test_good_actions_are_the_moves_that_shorten_the_solution(seed):
    """A move is judged optimal iff the puzzle is solvable in one move fewer after it; the
    solver's move always is, a blocked move never."""
    from starpo.envs.sokoban.env import move

    env = make("sokoban")
    env.reset(seed=seed)
    length = len(env._plan_from_here())
    good = env.good_actions()
    assert env.optimal_action() in good
    for index, name in enumerate(env.action_names):
        moved = move(env.level.walls, env.boxes, env.player, index)
        after = (
            None
            if moved is None
            else SokobanSolver(env.level.walls, env.level.targets, env.level.shape).solve(
                *moved, max_depth=length
            )
        )
        shortens = after is not None and len(after) == length - 1
        assert (name in good) == shortens, (name, after)
