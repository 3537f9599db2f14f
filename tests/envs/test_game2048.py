"""2048: rules by hand (slides, merges, spawns, rewards, game over), the contract, and the
heuristic solver against the random policy on fixed seeds."""

from __future__ import annotations

import numpy as np
import pytest

from starpo.envs import check_env, make
from starpo.envs.checker import CHECKS
from starpo.envs.game2048.env import SUCCESS_BONUS, Game2048Env
from starpo.envs.game2048.solver import can_move, merged_tiles, move, slide_row
from starpo.envs.policies import make_policy
from starpo.errors import UserError


def board_of(env: Game2048Env) -> list[list[int]]:
    """The board as tile values (0 = empty)."""
    return [[(1 << e) if e else 0 for e in row] for row in env.board]


@pytest.mark.parametrize(
    "kwargs", [{}, {"size": 3, "target": 64, "max_steps": 80}, {"size": 2, "target": 16}]
)
def test_checker_passes(kwargs):
    assert len(check_env(Game2048Env(**kwargs))) == len(CHECKS)


def test_registered_ids_build():
    assert make("2048").target == 256
    assert make("2048-3x3").size == 3


# --------------------------------------------------------------------- rules
@pytest.mark.parametrize(
    ("row", "slid", "points"),
    [
        ((1, 1, 1, 0), (2, 1, 0, 0), 4),  # 2 2 2 . -> 4 2: the leading pair merges
        ((1, 1, 1, 1), (2, 2, 0, 0), 8),
        ((2, 1, 1, 0), (2, 2, 0, 0), 4),  # 4 2 2 -> 4 4: a new tile does not merge again
        ((0, 0, 0, 1), (1, 0, 0, 0), 0),
        ((1, 0, 1, 2), (2, 2, 0, 0), 4),  # gaps close before merging
        ((1, 2, 1, 2), (1, 2, 1, 2), 0),
    ],
)
def test_slide_row(row, slid, points):
    assert slide_row(row) == (slid, points)


def test_moves_in_every_direction():
    board = ((1, 1, 0), (0, 2, 0), (1, 0, 2))  # 2 2 . / . 4 . / 2 . 4
    assert move(board, 2) == (((2, 0, 0), (2, 0, 0), (1, 2, 0)), 4)  # Left
    assert move(board, 3) == (((0, 0, 2), (0, 0, 2), (0, 1, 2)), 4)  # Right
    assert move(board, 0) == (((2, 1, 2), (0, 2, 0), (0, 0, 0)), 4)  # Up: 2+2 in column 0
    assert move(board, 1) == (((0, 0, 0), (0, 1, 0), (2, 2, 2)), 4)  # Down
    assert merged_tiles(board, 2) == [4]


def test_render_and_state_key():
    env = Game2048Env(size=3, target=256, max_steps=80)
    obs, info = env.reset(seed=0, options={"board": [[2, 0, 128], [0, 16, 0], [4, 0, 0]]})
    assert obs == "  2   . 128\n  .  16   .\n  4   .   .\nScore: 0"
    assert info["max_tile"] == 128
    assert env.state_key() == (2, 0, 128, 0, 16, 0, 4, 0, 0)
    env.score = 99  # the same board with another score is the same decision
    assert env.state_key() == (2, 0, 128, 0, 16, 0, 4, 0, 0)


def test_effective_move_merges_scores_and_spawns_one_tile():
    env = Game2048Env(size=4, target=256)
    env.reset(seed=3, options={"board": [[2, 2, 4, 0], [0] * 4, [0] * 4, [0, 0, 0, 8]]})
    obs, reward, terminated, truncated, info = env.step("left")
    assert reward == 4 / 256 and not terminated and not truncated
    assert info["action_is_valid"] and info["action_is_effective"] and info["action"] == "Left"
    assert info["points"] == 4 and env.score == 4 and obs.endswith("Score: 4")
    after = np.array(board_of(env))
    expected = np.array([[4, 4, 0, 0], [0] * 4, [0] * 4, [8, 0, 0, 0]])
    spawned = after != expected
    assert spawned.sum() == 1 and expected[spawned][0] == 0 and after[spawned][0] in (2, 4)


def test_move_that_changes_nothing_is_valid_but_not_effective():
    env = Game2048Env(size=2, target=16, max_steps=10)
    env.reset(seed=0, options={"board": [[2, 4], [0, 0]]})
    before = (env.snapshot(), repr(env.np_random.bit_generator.state))
    obs, reward, terminated, truncated, info = env.step("Up")
    assert info["action_is_valid"] and not info["action_is_effective"]
    assert reward == 0.0 and not terminated and env.steps_left == 9
    assert (env.snapshot(), repr(env.np_random.bit_generator.state)) == before  # no spawn


def test_reaching_the_target_ends_with_the_bonus():
    env = Game2048Env(size=4, target=256)
    env.reset(seed=1, options={"board": [[128, 128, 0, 0], [2, 0, 0, 0], [0] * 4, [0] * 4]})
    _, reward, terminated, _, info = env.step("Left")
    assert reward == 256 / 256 + SUCCESS_BONUS and terminated and info["success"]
    assert env.is_success() and env.optimal_success_probability() == 1.0


def test_reward_range_is_reached_by_the_largest_move():
    env = Game2048Env(size=4, target=256)
    env.reset(seed=0, options={"board": [[128] * 4, [128] * 4, [64] * 4, [64] * 4]})
    _, reward, terminated, _, _ = env.step("Left")  # 8 merges, two of them into the target
    assert reward == (2 * 2 * 256 + 2 * 2 * 128) / 256 + SUCCESS_BONUS and terminated
    env.reset(seed=0, options={"board": [[128] * 4] * 4})
    assert env.step("Left")[1] == env.reward_range[1] == 9.0


def test_game_over_when_no_move_is_left():
    # 4 8 / . 16: Left fills the last cell; a 2 or a 4 there leaves no equal neighbours.
    for seed in range(5):
        env = Game2048Env(size=2, target=32, max_steps=10)
        env.reset(seed=seed, options={"board": [[4, 8], [0, 16]]})
        _, reward, terminated, truncated, info = env.step("Left")
        assert terminated and not truncated and not info["success"] and reward == 0.0
        assert not can_move(env.board) and env.optimal_action() is None
        assert env.optimal_success_probability() == 0.0


def test_budget_truncates():
    env = Game2048Env(size=2, target=8, max_steps=1)
    env.reset(seed=0, options={"board": [[2, 0], [0, 0]]})
    *_, terminated, truncated, info = env.step("Down")
    assert truncated and not terminated and info["steps_left"] == 0


def test_same_seed_same_episode_and_seeds_differ():
    def episode(seed: int) -> list[str]:
        env = Game2048Env()
        observations = [env.reset(seed=seed)[0]]
        for i in range(60):
            obs, *_ = env.step(("Up", "Left", "Down", "Right")[i % 4])
            observations.append(obs)
            if env.done:
                break
        return observations

    assert episode(5) == episode(5)
    assert len({episode(s)[0] for s in range(10)}) > 1


def test_invalid_inputs_change_nothing():
    env = Game2048Env()
    env.reset(seed=2)
    before = (env.render(), env.snapshot(), env.steps_left)
    for action in ("Jump", "", "Up Left", None, 7, "Up||Left"):
        _, reward, terminated, truncated, info = env.step(action)
        assert not info["action_is_valid"] and reward == 0.0 and not (terminated or truncated)
    assert (env.render(), env.snapshot(), env.steps_left) == before


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"size": 1}, "size must be"),
        ({"size": 9}, "size must be"),
        ({"size": "4"}, "size must be"),
        ({"size": True}, "size must be"),
        ({"target": 100}, "target must be a power of two"),
        ({"target": 4}, "target must be a power of two"),
        ({"target": 2**18}, "target must be a power of two"),
        ({"size": 2, "target": 64}, "from 8 to 32"),
        ({"max_steps": 0}, "max_steps must be"),
        ({"max_steps": 2.5}, "max_steps must be"),
        ({"target": 2048, "max_steps": 100}, "cannot reach the target 2048"),
    ],
)
def test_bad_constructor_arguments(kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        Game2048Env(**kwargs)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"board": [[2, 0], [0, 0]]}, "4 rows"),
        ({"board": [[2, 0, 0], [0] * 4, [0] * 4, [0] * 4]}, "4 cells"),
        ({"board": [[3, 0, 0, 0], [0] * 4, [0] * 4, [0] * 4]}, "powers of two"),
        ({"board": [[256, 0, 0, 0], [0] * 4, [0] * 4, [0] * 4]}, "below the target"),
        ({"board": [[2, 4, 2, 4], [4, 2, 4, 2]] * 2}, "no move left"),
        ({"seed": 3}, "unknown reset options"),
    ],
)
def test_bad_reset_options(options, fragment):
    with pytest.raises(UserError, match=fragment):
        Game2048Env().reset(seed=0, options=options)


# -------------------------------------------------------------------- solver
def play(env: Game2048Env, policy_name: str, seed: int) -> tuple[bool, int]:
    policy = make_policy(policy_name, seed=seed)
    env.reset(seed=seed)
    while not env.done:
        *_, info = env.step(policy(env))
        assert info["action_is_valid"]
    return env.is_success(), env.max_tile


def test_heuristic_beats_random_on_fixed_seeds():
    env = Game2048Env()
    seeds = range(12)
    solver = [play(env, "solver", s) for s in seeds]
    random = [play(env, "random", s) for s in seeds]
    # Measured over seeds 0-99: the heuristic 100% (always 256), random 8% (mean tile 111).
    assert sum(ok for ok, _ in solver) >= 11
    assert sum(ok for ok, _ in random) <= 4
    assert np.mean([t for _, t in solver]) > 1.5 * np.mean([t for _, t in random])


def test_solver_moves_are_effective_and_explained():
    env = Game2048Env(size=3, target=64, max_steps=80)
    env.reset(seed=4)
    while not env.done:
        action = env.optimal_action()
        text = env.explain(action)
        assert action in env.action_names and action in text and len(text.split()) <= 40
        assert all(env.explain(a) is None for a in env.action_names if a != action)
        points = move(env.board, env.action_names.index(action))[1]
        assert (f"(+{points} points)" in text) == (points > 0)
        *_, info = env.step(action)
        assert info["action_is_effective"]
    assert env.optimal_action() is None


def test_success_estimate_is_deterministic_and_leaves_the_env_alone():
    env = Game2048Env(size=3, target=64, max_steps=80)
    env.reset(seed=6)
    before = (env.snapshot(), repr(env.np_random.bit_generator.state))
    first = env.optimal_success_probability()
    assert 0.0 <= first <= 1.0 and env.optimal_success_probability() == first
    assert (env.snapshot(), repr(env.np_random.bit_generator.state)) == before
    assert first >= 0.75  # the heuristic wins 98% of seeds 0-199 on this setting


def test_success_estimate_is_zero_when_the_budget_cannot_reach_the_target():
    # The tile sum grows by at most 4 a move; 4 + 4 * 63 = 256 leaves no 2 to spare.
    env = Game2048Env(size=4, target=256, max_steps=63)
    env.reset(seed=0, options={"board": [[2, 2, 0, 0], [0] * 4, [0] * 4, [0] * 4]})
    env.step("Left")
    assert sum(map(sum, board_of(env))) == 6  # this seed spawned a 2: 6 + 4 * 62 < 256
    assert env.optimal_success_probability() == 0.0


@pytest.mark.parametrize("policy_name", ["random", "solver"])
def test_reference_policies_finish_episodes(policy_name):
    env = make("2048-3x3")
    for seed in range(3):
        ok, _ = play(env, policy_name, seed)
        assert env.done and isinstance(ok, bool)
