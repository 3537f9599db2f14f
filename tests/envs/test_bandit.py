"""Bandit: shuffled arm order, reward laws, success = high-EV arm."""

from __future__ import annotations

import pytest

from starpo.envs import make, register
from starpo.envs.bandit import BanditEnv
from starpo.errors import UserError


def test_arm_order_is_shuffled_across_resets_and_fixed_per_seed():
    env = make("bandit")
    orders = {env.reset(seed=seed)[0] for seed in range(40)}
    assert orders == {"Arms: Phoenix | Dragon", "Arms: Dragon | Phoenix"}
    assert env.reset(seed=5)[0] == env.reset(seed=5)[0]


def test_reward_laws_match_reference():
    env = make("bandit")
    phoenix, dragon = [], []
    for seed in range(4000):
        env.reset(seed=seed)
        arm = "Dragon" if seed % 2 else "Phoenix"
        _, reward, terminated, truncated, info = env.step(arm)
        assert terminated and not truncated
        (dragon if arm == "Dragon" else phoenix).append(reward)
        assert info["success"] == (arm == "Dragon")  # 0.25 * 1.0 > 0.1
    assert set(phoenix) == {0.1}
    assert set(dragon) == {0.0, 1.0}
    win_rate = sum(dragon) / len(dragon)
    # 2000 Bernoulli(0.25) draws: standard error ~0.0097; 5 sigma keeps this test deterministic.
    assert abs(win_rate - 0.25) < 0.05


def test_bandit_rev_names_and_success():
    env = make("bandit-rev")
    env.reset(seed=1)
    assert set(env.action_names) == {"Trader", "Librarian"}
    assert env.best_arm == "Librarian" and env.optimal_action() == "Librarian"
    *_, info = env.step("librarian")
    assert info["success"] and info["action"] == "Librarian"


def test_configurable_reward_laws_change_the_best_arm():
    env = make("bandit", low_risk_reward=0.5)  # now the safe arm has the higher EV
    env.reset(seed=0)
    assert env.best_arm == "Phoenix"
    *_, info = env.step("Phoenix")
    assert info["success"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"high_risk_prob": 1.5},
        {"low_risk_name": "Dragon"},
        {"high_risk_name": ""},
        {"low_risk_name": "a || b"},
    ],
)
def test_bad_bandit_arguments_are_user_errors(kwargs):
    with pytest.raises(UserError):
        make("bandit", **kwargs)


@pytest.mark.parametrize("value", ["nan", float("nan"), float("inf"), True, None, "0.5"])
def test_a_reward_or_probability_that_is_not_a_finite_number_is_one_line(value):
    with pytest.raises(UserError, match="high_risk_prob must be a finite number"):
        make("bandit", high_risk_prob=value)


def test_an_env_whose_constructor_rejects_the_arguments_names_them():
    class Picky(BanditEnv):
        def __init__(self, size: int = 3) -> None:
            super().__init__()
            self.size = size + 1  # "a" + 1: TypeError for a string

    from starpo.envs.registry import ENVS

    register("picky-test", Picky, overwrite=True)
    try:
        with pytest.raises(UserError, match=r"env 'picky-test' cannot be built with size='a'"):
            make("picky-test", size="a")
    finally:
        ENVS.unregister("picky-test")
