"""Wilson interval against a naive reference; episode records round-trip through JSON."""

from __future__ import annotations

import math

import pytest

from starpo.envs import make
from starpo.envs.policies import make_policy
from starpo.errors import UserError
from starpo.evaluation.scripted import run_episode
from starpo.evaluation.summary import summarise
from starpo.stats import wilson_interval
from starpo.types import Episode


def naive_wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson bounds as the roots of (p_hat - p)^2 = z^2 p (1 - p) / n, solved directly."""
    p_hat = k / n
    a = 1 + z * z / n
    b = -(2 * p_hat + z * z / n)
    c = p_hat * p_hat
    disc = math.sqrt(b * b - 4 * a * c)
    return ((-b - disc) / (2 * a), (-b + disc) / (2 * a))


@pytest.mark.parametrize(("k", "n"), [(0, 10), (10, 10), (3, 10), (50, 100), (1, 256), (200, 256)])
def test_wilson_interval_matches_quadratic_roots(k: int, n: int):
    low, high = wilson_interval(k, n)
    ref_low, ref_high = naive_wilson(k, n)
    assert low == pytest.approx(max(0.0, ref_low), abs=1e-12)
    assert high == pytest.approx(min(1.0, ref_high), abs=1e-12)
    assert low <= k / n <= high


def test_episode_json_round_trip_and_summary():
    env = make("sokoban")
    episode = run_episode(
        env, make_policy("solver"), seed=123, env_id="sokoban", policy_name="solver"
    )
    assert episode.success and episode.optimal_success_prob == 1.0
    again = Episode.from_json(episode.to_json())
    assert again == episode
    summary = summarise([episode])
    assert summary["success"] == 1.0 and summary["valid_action_rate"] == 1.0
    assert summary["reward"] == pytest.approx(episode.total_reward)


def test_unknown_policy_is_a_user_error():
    with pytest.raises(UserError, match="random, solver"):
        make_policy("greedy")


def test_policies_that_play_the_solver_refuse_an_env_without_one(monkeypatch):
    from starpo.envs.base import TextEnv
    from starpo.envs.frozenlake import FrozenLakeEnv
    from starpo.evaluation.scripted import play_episodes

    monkeypatch.setattr(FrozenLakeEnv, "optimal_action", TextEnv.optimal_action)
    for policy in ("solver", "weak"):
        with pytest.raises(UserError, match=f"policy '{policy}' plays the env's solver"):
            play_episodes("frozenlake", policy, 2)
    assert len(list(play_episodes("frozenlake", "random", 2))) == 2


def test_the_validation_seeds_have_one_owner():
    """`starpo eval`, the trainer's validation and SFT's guard read one pair of defaults."""
    import inspect

    from starpo.cli import build_parser
    from starpo.config import TrainerConfig
    from starpo.defaults import VALIDATION_SEED_START, VALIDATION_SEEDS
    from starpo.evaluation.scripted import play_episodes
    from starpo.sft.data import validation_seeds

    assert (VALIDATION_SEED_START, VALIDATION_SEEDS) == (123, 256)
    args = build_parser().parse_args(
        ["eval", "--env", "bandit", "--policy", "random", "--out", "x"]
    )
    assert args.seed_start == VALIDATION_SEED_START
    trainer = TrainerConfig()
    assert (trainer.val_seed_start, trainer.val_seeds) == (VALIDATION_SEED_START, VALIDATION_SEEDS)
    default = inspect.signature(play_episodes).parameters["seed_start"].default
    assert default == VALIDATION_SEED_START
    assert validation_seeds() == range(VALIDATION_SEED_START, VALIDATION_SEED_START + 256)


def test_optimal_action_rate_ranks_the_solver_above_random_play():
    """On dry-ice FrozenLake the solver's moves are all optimal and random moves are so about
    a third of the time (a cell closer to the goal); an env that judges no moves (Countdown)
    gets no rate at all rather than a made-up one."""
    from starpo.evaluation.scripted import play_episodes

    dry = {"is_slippery": False}
    solver = summarise(list(play_episodes("frozenlake", "solver", 32, env_kwargs=dry)))
    random = summarise(list(play_episodes("frozenlake", "random", 64, env_kwargs=dry)))
    assert solver["optimal_action_rate"] == 1.0
    assert 0.2 < random["optimal_action_rate"] < 0.5
    assert "optimal_action_rate" not in summarise(list(play_episodes("countdown", "random", 4)))
    episode = next(play_episodes("frozenlake", "random", 1, env_kwargs=dry))
    assert Episode.from_json(episode.to_json()) == episode  # the judged flags round-trip
