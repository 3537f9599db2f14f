"""check_env passes on every registered env and catches envs that break the contract."""

from __future__ import annotations

from typing import Any

import pytest

from starpo.envs import TextEnv, check_env, make, standalone_ids
from starpo.envs.checker import EnvCheckError


@pytest.mark.parametrize("env_id", standalone_ids())
def test_every_registered_env_passes_the_checker(env_id: str):
    passed = check_env(make(env_id))
    assert "determinism" in passed and "invalid actions" in passed


class CounterEnv(TextEnv):
    """A correct minimal env; subclasses below each break one rule."""

    description = "count up to three"
    action_names = ("Inc", "Stay")
    instruction = "Press Inc three times."
    legend = {"n": "the counter"}
    reward_range = (0.0, 1.0)

    def __init__(self) -> None:
        super().__init__(max_steps=5)
        self.count = 0
        self.noise = 0

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.count = 0
        self.noise = int(self.np_random.integers(0, 100))
        return {}

    def _step(self, action_index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        if action_index == 0:
            self.count += 1
        done = self.count >= 3
        return (1.0 if done else 0.0), done, action_index == 0, {}

    def render(self) -> str:
        return f"n={self.count} noise={self.noise}"

    def snapshot(self) -> Any:
        return (self.count, self.noise)

    def is_success(self) -> bool:
        return self.count >= 3


class NondeterministicEnv(CounterEnv):
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        import random

        self.count = 0
        self.noise = random.randrange(10**9)  # ignores the env's own seeded generator
        return {}


class RewardOutOfRangeEnv(CounterEnv):
    def _step(self, action_index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        reward, done, effective, info = super()._step(action_index)
        return reward * 5, done, effective, info


class RaisingActionEnv(CounterEnv):
    def action_index(self, action: Any) -> int | None:
        return self.action_names.index(action)  # raises on unknown names


class StatefulInvalidEnv(CounterEnv):
    def step(self, action: Any):
        if self.action_index(action) is None:
            self.noise += 1  # an invalid action must change nothing
        return super().step(action)


class SetKeyEnv(CounterEnv):
    def state_key(self) -> Any:
        return frozenset({self.count})  # a set's repr order is not fixed across processes


class ClockKeyEnv(CounterEnv):
    def state_key(self) -> Any:
        import time

        return (self.count, time.perf_counter_ns())  # never equal twice


class JudgedCounterEnv(CounterEnv):
    """Judges moves correctly: Inc is the only move that helps."""

    def optimal_action(self) -> str | None:
        return None if self.done else "Inc"

    def good_actions(self) -> frozenset[str] | None:
        return None if self.done else frozenset({"Inc"})


class SolverOutsideGoodEnv(JudgedCounterEnv):
    def good_actions(self) -> frozenset[str] | None:
        return frozenset({"Stay"})


class UnknownGoodActionEnv(JudgedCounterEnv):
    def good_actions(self) -> frozenset[str] | None:
        return frozenset({"Inc", "Jump"})


class StartingCounterEnv(CounterEnv):
    """Starts part-way correctly: the counter is the position (the noise is the seed's)."""

    def start_state(self) -> Any:
        return {"count": self.count}

    def _start_at(self, state: Any) -> None:
        self.count = state["count"]


class ForgetfulStartEnv(StartingCounterEnv):
    def _start_at(self, state: Any) -> None:
        self.count = 0  # ignores where it was asked to start


class ObjectStartEnv(StartingCounterEnv):
    def start_state(self) -> Any:
        return {"count": (self.count,)}  # a tuple: not what JSON gives back

    def _start_at(self, state: Any) -> None:
        self.count = state["count"][0]


def test_minimal_correct_env_passes():
    assert len(check_env(CounterEnv())) == 10
    assert "start states" in check_env(StartingCounterEnv())
    assert "judged moves" in check_env(JudgedCounterEnv())


@pytest.mark.parametrize(
    ("env_class", "fragment"),
    [
        (NondeterministicEnv, "twice gave different initial states"),
        (RewardOutOfRangeEnv, "outside reward_range"),
        (RaisingActionEnv, "raised"),
        (StatefulInvalidEnv, "changed the state"),
        (SetKeyEnv, "state_key.. must return a str, an int or a tuple"),
        (ClockKeyEnv, "different state keys"),
        (SolverOutsideGoodEnv, "is not in good_actions"),
        (UnknownGoodActionEnv, "frozenset of action names"),
        (ForgetfulStartEnv, "did not start there"),
        (ObjectStartEnv, "must be a JSON value"),
    ],
)
def test_checker_catches_broken_envs(env_class: type[TextEnv], fragment: str):
    with pytest.raises(EnvCheckError, match=fragment):
        check_env(env_class())


def test_checker_rejects_non_textenv():
    with pytest.raises(EnvCheckError, match="does not subclass TextEnv"):
        check_env(object())  # type: ignore[arg-type]


def test_step_after_episode_end_asks_for_reset():
    env = make("bandit")
    env.reset(seed=0)
    env.step(env.action_names[0])
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.action_names[0])


def test_state_digest_is_stable_and_refuses_unstable_keys():
    from starpo.envs.base import state_digest
    from starpo.errors import UserError

    assert state_digest(("a", 1)) == state_digest(("a", 1)) != state_digest(("a", 2))
    assert len(state_digest("grid")) == 16
    with pytest.raises(UserError, match="returned a frozenset"):
        state_digest(frozenset({1}))
