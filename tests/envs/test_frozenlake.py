"""FrozenLake env, map generator and value-iteration solver.

Statistical tests use fixed seeds (never flaky) and tolerances of about 5 standard errors,
so a correct implementation passes with any seed, and a wrong one (e.g. a 1/2-1/4-1/4 slip
or a missing perpendicular) fails by a wide margin.
"""

from __future__ import annotations

import math
import subprocess
import sys
from functools import cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.envs.frozenlake.env import (
    FrozenLakeEnv,
    draw_map,
    generate_map,
    validate_desc,
)
from starpo.envs.frozenlake.solver import (
    ACTIONS,
    MOVES,
    NO_ACTION,
    as_rows,
    find_tile,
    quickest_candidates,
    shortest_path_length,
    solve,
    solve_with_ties,
    transition_matrix,
    transitions,
)
from starpo.errors import UserError

STANDARD = ("SFFF", "FHFH", "FFFH", "HFFG")  # Gymnasium's 4x4 map
OPEN_5X5 = ("FFFFF", "FFFFF", "FFSFF", "FFFFF", "FFFFG")  # start in the middle, no holes


def with_start_at(desc: tuple[str, ...], position: tuple[int, int]) -> tuple[str, ...]:
    """The same map with the start tile moved to `position` (the old start becomes F)."""
    rows = [list(row.replace("S", "F")) for row in desc]
    rows[position[0]][position[1]] = "S"
    return tuple("".join(row) for row in rows)


def run_episode(env: FrozenLakeEnv, choose, desc=STANDARD) -> float:
    """Play one episode on `desc` with `choose(env) -> action`; return the total reward."""
    env.reset(options={"desc": desc})
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(choose(env))
        total += reward
        done = terminated or truncated
    return total


def five_sigma(p: float, n: int) -> float:
    return 5 * math.sqrt(max(p * (1 - p), 1e-4) / n)


# ------------------------------------------------------------------ map generation
def test_random_maps_always_have_a_path_and_distinct_start_goal():
    env = FrozenLakeEnv()
    for seed in range(500):
        env.reset(seed=seed)
        rows = env.desc
        assert len(rows) == 4 and all(len(row) == 4 for row in rows)
        assert validate_desc(rows) == rows  # exactly one S and one G, valid letters
        assert find_tile(rows, "S") != find_tile(rows, "G")
        assert shortest_path_length(rows) is not None


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(2, 7),
    p_frozen=st.floats(0.25, 1.0),
)
def test_generated_maps_are_valid_for_any_size_and_density(seed, size, p_frozen):
    rows = generate_map(np.random.default_rng(seed), size, p_frozen)
    assert len(rows) == size and {len(row) for row in rows} == {size}
    validate_desc(rows)
    assert shortest_path_length(rows) is not None


def test_same_seed_same_map_and_different_seeds_vary():
    a, b = FrozenLakeEnv(), FrozenLakeEnv()
    maps = set()
    for seed in range(60):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b and a.desc == b.desc
        maps.add(a.desc)
    assert len(maps) >= 55
    starts = {find_tile(m, "S") for m in maps}
    goals = {find_tile(m, "G") for m in maps}
    assert len(starts) >= 10 and len(goals) >= 10  # start and goal are random, not fixed


def test_p_frozen_controls_holes():
    rng = np.random.default_rng(0)
    assert all("H" not in "".join(draw_map(rng, 5, 1.0)) for _ in range(50))
    # Unconditioned draws: the hole rate among the other tiles matches 1 - p_frozen.
    tiles = "".join("".join(draw_map(rng, 6, 0.7)) for _ in range(400))
    holes, others = tiles.count("H"), len(tiles) - 2 * 400
    assert abs(holes / others - 0.3) < five_sigma(0.3, others)


def test_impossible_generation_gives_user_error():
    with pytest.raises(UserError, match="p_frozen"):
        generate_map(np.random.default_rng(0), 8, 1e-9, max_tries=5)


# --------------------------------------------------------------- explicit maps, args
def test_explicit_desc_is_used_and_rendered():
    env = FrozenLakeEnv()
    obs, info = env.reset(seed=1, options={"desc": list(STANDARD)})
    assert obs == "P___\n_O_O\n___O\nO__G"
    assert env.desc == STANDARD and info["success"] is False
    assert info["steps_left"] == 10
    fixed = FrozenLakeEnv(desc=STANDARD)
    assert fixed.reset(seed=3)[0] == fixed.reset(seed=4)[0] == obs
    # A per-episode desc overrides the constructor's; the next plain reset returns to it.
    assert fixed.reset(options={"desc": ["SG"]})[0] == "PG"
    assert fixed.reset()[0] == obs


@pytest.mark.parametrize(
    "desc, words",
    [
        (["SFF", "FG"], "rectangular"),
        (["SFFF", "FHXG"], "unknown letters"),
        (["FFF", "FFG"], "exactly one S"),
        (["SFS", "FFG"], "exactly one S"),
        (["SFF", "FFF"], "exactly one G"),
        (["SGF", "FFG"], "exactly one G"),
        ([], "non-empty"),
        ("SFFG", "list of row strings"),
        (["SF", ""], "non-empty strings"),
        ([["S", "G"]], "strings"),
    ],
)
def test_bad_desc_is_a_one_line_user_error(desc, words):
    with pytest.raises(UserError, match=words) as exc:
        FrozenLakeEnv().reset(options={"desc": desc})
    assert "\n" not in str(exc.value)
    with pytest.raises(UserError):
        FrozenLakeEnv(desc=desc)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"size": 1}, "size"),
        ({"size": 2.5}, "size"),
        ({"size": True}, "size"),
        ({"p_frozen": 0.0}, "p_frozen"),
        ({"p_frozen": 1.5}, "p_frozen"),
        ({"p_frozen": float("nan")}, "p_frozen"),
        ({"p_frozen": "0.8"}, "p_frozen"),
        ({"is_slippery": "yes"}, "is_slippery"),
        ({"max_steps": 0}, "max_steps"),
    ],
)
def test_bad_constructor_args_are_one_line_user_errors(kwargs, name):
    with pytest.raises(UserError, match=name) as exc:
        FrozenLakeEnv(**kwargs)
    assert "\n" not in str(exc.value)


def test_unknown_reset_option_is_a_user_error():
    with pytest.raises(UserError, match="desc"):
        FrozenLakeEnv().reset(options={"map": STANDARD})


def test_text_attributes():
    env = FrozenLakeEnv()
    assert env.action_names == ("Left", "Down", "Right", "Up")
    assert env.reward_range == (0.0, 1.0)
    assert set(env.legend) == {"P", "_", "O", "G", "X", "√"}
    assert "slippery" in env.instruction and "hole" in env.instruction
    assert "slippery" not in FrozenLakeEnv(is_slippery=False).instruction
    assert env.description and "\n" not in env.description
    with pytest.raises(RuntimeError, match="reset"):
        env.render()


# ------------------------------------------------------------- deterministic dynamics
def test_dry_ice_moves_exactly_and_renders_symbols():
    env = FrozenLakeEnv(is_slippery=False)
    env.reset(options={"desc": STANDARD})
    obs, reward, terminated, truncated, info = env.step("right")  # case-insensitive
    assert obs == "_P__\n_O_O\n___O\nO__G"  # the start tile renders as frozen once left
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["action"] == "Right" and info["action_is_effective"] and not info["slipped"]
    before = env.snapshot()
    obs, *_, info = env.step("Up")  # off the grid: stays in place
    assert not info["action_is_effective"] and info["action_is_valid"]
    assert env.snapshot() == before and obs == "_P__\n_O_O\n___O\nO__G"
    obs, reward, terminated, _, info = env.step("Down")  # into the hole at (1, 1)
    assert obs == "____\n_X_O\n___O\nO__G"
    assert (reward, terminated, info["success"], env.is_success()) == (0.0, True, False, False)
    assert env.snapshot().in_hole and env.optimal_action() is None


def test_reaching_the_goal_rewards_one():
    env = FrozenLakeEnv(is_slippery=False)
    env.reset(options={"desc": STANDARD})
    rewards = [env.step(a)[1] for a in ["Down", "Down", "Right", "Right", "Down"]]
    obs, reward, terminated, truncated, info = env.step("Right")
    assert rewards == [0.0] * 5 and obs == "____\n_O_O\n___O\nO__√"
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert env.snapshot().on_goal and env.optimal_success_probability() == 1.0


def test_invalid_action_changes_nothing_and_budget_truncates():
    env = FrozenLakeEnv(is_slippery=False, max_steps=2)
    env.reset(options={"desc": STANDARD})
    before = env.snapshot()
    obs, reward, terminated, truncated, info = env.step("Jump")
    assert not info["action_is_valid"] and info["steps_left"] == 2
    assert env.snapshot() == before and (reward, terminated, truncated) == (0.0, False, False)
    env.step("Left")
    *_, terminated, truncated, info = env.step("Up")
    assert (terminated, truncated, info["steps_left"]) == (False, True, 0)
    assert env.optimal_action() is None and env.optimal_success_probability() == 0.0


def test_snapshot_is_hashable_and_tracks_state():
    env = FrozenLakeEnv()
    env.reset(seed=5)
    snap = env.snapshot()
    assert hash(snap) == hash(env.snapshot()) and snap.desc == env.desc
    assert snap.position == find_tile(env.desc, "S") and not snap.in_hole and not snap.on_goal


def test_same_seed_and_actions_give_the_same_transitions():
    def trace(seed: int) -> list:
        env = FrozenLakeEnv(max_steps=8)
        env.reset(seed=seed)
        out, rng = [], np.random.default_rng(99)  # the same action sequence for every seed
        for _ in range(40):
            obs, reward, terminated, truncated, info = env.step(ACTIONS[rng.integers(4)])
            out.append((obs, reward, terminated, truncated, info["slipped"], env.snapshot()))
            if terminated or truncated:
                env.reset()  # a new random map from the same generator
        return out

    assert trace(7) == trace(7)
    assert trace(7) != trace(8)


# ----------------------------------------------------------------- slippery dynamics
@pytest.mark.parametrize("action", range(4))
def test_slip_frequencies_are_one_third_each(action):
    """From the middle of an open map: intended and both perpendicular moves 1/3 each (chi-
    square, 2 degrees of freedom, closed-form p-value exp(-x/2)), never the opposite."""
    env = FrozenLakeEnv(max_steps=1)
    env.reset(seed=1000 + action, options={"desc": OPEN_5X5})
    counts = np.zeros(4, dtype=int)
    n = 3000
    for _ in range(n):
        env.reset(options={"desc": OPEN_5X5})  # keeps the seeded generator running
        env.step(ACTIONS[action])
        delta = (env.position[0] - 2, env.position[1] - 2)
        counts[MOVES.index(delta)] += 1
    opposite = (action + 2) % 4
    assert counts[opposite] == 0
    observed = np.delete(counts, opposite)
    chi2 = float(((observed - n / 3) ** 2 / (n / 3)).sum())
    assert math.exp(-chi2 / 2) > 1e-6, (ACTIONS[action], counts.tolist())


def test_env_samples_exactly_the_support_of_the_model():
    """From every non-terminal tile of the standard map, each action's observed next tiles
    are exactly the model's outcomes (each has probability >= 1/3: 60 draws miss one with
    probability below 1e-10)."""
    model = transitions(STANDARD, is_slippery=True)
    env = FrozenLakeEnv(max_steps=1)
    env.reset(seed=0, options={"desc": STANDARD})
    for s, tile in enumerate("".join(STANDARD)):
        if tile in "HG":
            continue
        desc = with_start_at(STANDARD, divmod(s, 4))
        for a in range(4):
            seen = set()
            for _ in range(60):
                env.reset(options={"desc": desc})
                env.step(a)
                seen.add(env.position[0] * 4 + env.position[1])
            assert seen == {nxt for _, nxt, _, _ in model[s][a]}, (s, ACTIONS[a])


# ---------------------------------------------------------------------------- model
def test_transition_model_is_gymnasium_shaped():
    model = transitions(STANDARD, is_slippery=True)
    assert len(model) == 16 and all(len(per_action) == 4 for per_action in model)
    for per_action in model:
        for outcomes in per_action:
            assert math.isclose(sum(p for p, *_ in outcomes), 1.0)
    assert model[5][0] == [(1.0, 5, 0.0, True)]  # a hole is absorbing
    assert sorted(model[14][2]) == sorted(
        [(1 / 3, 10, 0.0, False), (1 / 3, 15, 1.0, True), (1 / 3, 14, 0.0, False)]
    )
    assert sorted(model[0][0]) == sorted([(2 / 3, 0, 0.0, False), (1 / 3, 4, 0.0, False)])
    assert transitions(STANDARD, is_slippery=False)[0][2] == [(1.0, 1, 0.0, False)]
    assert np.allclose(transition_matrix(STANDARD).sum(axis=2), 1.0)


def test_solver_accepts_gymnasium_byte_arrays():
    as_bytes = np.asarray(STANDARD, dtype="c")  # how Gymnasium stores `desc`
    assert as_rows(as_bytes) == STANDARD
    assert np.array_equal(solve(as_bytes, 20)[1], solve(list(STANDARD), 20)[1])


def naive_value(desc: tuple[str, ...], horizon: int, is_slippery: bool) -> list[list[float]]:
    """Reference: memoised recursion over Gymnasium-style transition lists."""
    model = transitions(desc, is_slippery)

    @cache
    def value(t: int, s: int) -> float:
        tile = "".join(desc)[s]
        if tile == "G":
            return 1.0
        if tile == "H" or t == 0:
            return 0.0
        return max(sum(p * value(t - 1, nxt) for p, nxt, _, _ in model[s][a]) for a in range(4))

    return [[value(t, s) for s in range(len(model))] for t in range(horizon + 1)]


@pytest.mark.parametrize("is_slippery", [True, False])
def test_value_iteration_matches_naive_recursion(is_slippery):
    rng = np.random.default_rng(3)
    for size in (2, 3, 4, 5):
        for _ in range(5):
            desc = generate_map(rng, size, 0.7)
            policy, success = solve(desc, 9, is_slippery)
            assert np.allclose(success, naive_value(desc, 9, is_slippery), atol=1e-12)
            # The chosen action attains the maximum (policy consistent with the values).
            q = transition_matrix(desc, is_slippery) @ success[8]
            acting = policy[9] != NO_ACTION
            assert np.allclose(q[acting, policy[9][acting]], success[9][acting])
            assert (policy[0] == NO_ACTION).all()


def test_standard_map_value_converges_to_the_policy_fixed_point():
    """Long-horizon VI equals the exact absorbing-chain success probability of its own
    policy, solved as a linear system (an independent computation); for this map that is
    14/17 from the start."""
    policy, success = solve(STANDARD, 2000)
    matrix = transition_matrix(STANDARD)
    tiles = np.array(list("".join(STANDARD)))
    transient = np.flatnonzero(~np.isin(tiles, ["H", "G"]))
    chain = matrix[transient, policy[2000][transient]]  # (n_transient, 16)
    goal_now = chain[:, tiles == "G"].sum(axis=1)
    exact = np.linalg.solve(np.eye(len(transient)) - chain[:, transient], goal_now)
    assert np.allclose(success[2000][transient], exact, atol=1e-9)
    assert math.isclose(success[2000][0], 14 / 17, abs_tol=1e-9)
    assert 0.74 < success[100][0] < 0.75 and 0.81 < success[200][0] < 0.82


def test_optimal_policy_monte_carlo_matches_value_and_beats_random():
    """4000 episodes of the VI policy in the env (horizon 100) hit the exact value within 5
    standard errors; a uniformly random policy does far worse."""
    env = FrozenLakeEnv(max_steps=100)
    env.reset(seed=2024, options={"desc": STANDARD})
    exact = env.optimal_success_probability()
    assert math.isclose(exact, solve(STANDARD, 100)[1][100][0])
    n = 4000
    wins = sum(run_episode(env, lambda e: e.optimal_action() or "Left") for _ in range(n))
    assert abs(wins / n - exact) < five_sigma(exact, n), (wins / n, exact)
    rng = np.random.default_rng(1)
    random_wins = sum(run_episode(env, lambda e: ACTIONS[rng.integers(4)]) for _ in range(400))
    assert random_wins / 400 < exact - 0.4


def test_dry_ice_success_iff_shortest_path_fits_the_horizon():
    rng = np.random.default_rng(11)
    for _ in range(60):
        desc = generate_map(rng, 5, 0.6)
        length = shortest_path_length(desc)
        start = find_tile(desc, "S")
        _, success = solve(desc, length + 2, is_slippery=False)
        for horizon in range(length + 3):
            expected = 1.0 if length <= horizon else 0.0
            assert success[horizon][start[0] * 5 + start[1]] == expected
        env = FrozenLakeEnv(size=5, is_slippery=False, max_steps=length)
        assert run_episode(env, lambda e: e.optimal_action(), desc) == 1.0


def test_optimal_success_probability_falls_with_fewer_steps_left():
    values = []
    for max_steps in range(1, 30):
        env = FrozenLakeEnv(max_steps=max_steps)
        env.reset(options={"desc": STANDARD})
        values.append(env.optimal_success_probability())
    assert values[:5] == [0.0] * 5  # the goal is 6 moves away
    assert (np.diff(values) >= 0).all()
    assert values[-1] > values[10] > values[5] > 0


def test_unreachable_goal_has_no_helpful_action():
    env = FrozenLakeEnv()
    env.reset(options={"desc": ["SH", "HG"]})
    assert env.optimal_success_probability() == 0.0 and env.optimal_action() is None


def test_optimal_action_is_the_known_gymnasium_policy():
    env = FrozenLakeEnv(max_steps=500)
    env.reset(options={"desc": STANDARD})
    assert env.optimal_action() == "Left"  # the classic cautious move from the start


@pytest.mark.parametrize("seed", range(40))
def test_on_dry_ice_the_solver_walks_a_shortest_path(seed):
    """With moves to spare, a detour reaches the goal as surely as the direct path; the
    solver takes the direct one (it once walked Left whenever the budget allowed it)."""
    env = FrozenLakeEnv(is_slippery=False, max_steps=10)
    env.reset(seed=seed)
    shortest = shortest_path_length(env.desc)
    moves = 0
    while (action := env.optimal_action()) is not None:
        env.step(action)
        moves += 1
    assert env.is_success() and moves == shortest


def _moves_to_goal(desc: tuple[str, ...], cell: tuple[int, int]) -> int | None:
    """Fewest moves from `cell` to the goal around the holes (None off the map or in a hole),
    by the map-level BFS `shortest_path_length` with the start moved to `cell`."""
    r, c = cell
    if not (0 <= r < len(desc) and 0 <= c < len(desc[0])) or desc[r][c] == "H":
        return None
    return 0 if desc[r][c] == "G" else shortest_path_length(with_start_at(desc, cell))


@pytest.mark.parametrize("seed", range(40))
def test_on_dry_ice_the_good_actions_are_the_moves_a_cell_closer(seed):
    """Every move a cell closer to the goal is judged optimal, and only those; walking the
    last of them (not the solver's own tie-break) keeps them so all the way."""
    env = FrozenLakeEnv(is_slippery=False, max_steps=10)
    env.reset(seed=seed)
    while not env.done:
        here = env.position
        distance = _moves_to_goal(env.desc, here)
        closer = {
            name
            for name, (dr, dc) in zip(ACTIONS, MOVES, strict=True)
            if _moves_to_goal(env.desc, (here[0] + dr, here[1] + dc)) == distance - 1
        }
        assert env.good_actions() == closer
        *_, info = env.step(sorted(closer)[-1])
        assert info["action_is_optimal"] is True
    assert env.is_success()


def test_a_lost_episode_judges_no_move():
    env = FrozenLakeEnv()
    env.reset(options={"desc": ["SH", "HG"]})
    assert env.good_actions() is None
    *_, info = env.step("Right")
    assert info["action_is_optimal"] is None


def test_slippery_good_actions_hold_the_solver_move_and_only_equally_good_ones():
    env = FrozenLakeEnv(max_steps=100)
    env.reset(options={"desc": STANDARD})
    assert env.good_actions() == {"Left"}  # the classic cautious move is the only best one


def test_quickest_candidates_break_ties_by_the_next_budget_and_the_policy_takes_the_lowest_id():
    now = np.array([[1.0, 1.0, 1.0, 0.5]])  # three actions equally sure within t moves
    sooner = np.array([[0.0, 1.0, 1.0, 1.0]])  # two of them also within t - 1
    assert quickest_candidates([now, sooner]).tolist() == [[False, True, True, False]]
    assert quickest_candidates([now]).tolist() == [[True, True, True, False]]
    last_bits = quickest_candidates([now + 1e-15, sooner])  # last-bit differences are ties
    assert last_bits.tolist() == [[False, True, True, False]]
    for is_slippery in (False, True):
        solution = solve_with_ties(STANDARD, 12, is_slippery)
        acting = solution.policy != NO_ACTION
        lowest = np.argmax(solution.best, axis=2)  # the lowest id among the tied actions
        assert np.array_equal(solution.policy[acting], lowest[acting])
        assert not solution.best[~acting].any()  # no action judged where none is taken


# --------------------------------------------------------------- packaging contracts
def test_registry_builds_frozenlake():
    pytest.importorskip("starpo.envs.checker")  # written in parallel; skip until it exists
    from starpo.envs import make

    env = make("frozenlake", size=5, max_steps=7)
    assert isinstance(env, FrozenLakeEnv) and env.size == 5
    obs, _ = env.reset(seed=10000)
    assert len(obs.split("\n")) == 5
    with pytest.raises(UserError, match="p_frozen"):
        make("frozenlake", p_frozn=0.5)


def test_frozenlake_does_not_import_torch():
    code = "import sys, starpo.envs.frozenlake.env; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("size", [1, 65, 100_000])
def test_a_size_out_of_range_is_a_one_line_user_error(size):
    # size=100000 ran out of memory building its grid (found by fuzzing).
    with pytest.raises(UserError, match="size must be an integer from 2 to 64"):
        FrozenLakeEnv(size=size)


def test_the_coordinates_line_names_the_player_goal_and_holes():
    env = FrozenLakeEnv(is_slippery=False, coordinates=True)
    obs, _ = env.reset(options={"desc": ["SF", "HG"]})
    assert obs == "P_\nOG\nPlayer at (0, 0); goal at (1, 1); holes at (1, 0)."
    obs = env.step("Right")[0]
    assert obs.splitlines()[-1] == "Player at (0, 1); goal at (1, 1); holes at (1, 0)."
    env.reset(options={"desc": ["SG"]})
    assert env.render().endswith("holes at none.")
