"""The free-text env contract: an env with no action names judges answers itself."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from starpo.cli.play import describe, play_interactive
from starpo.envs import TextEnv, check_env
from starpo.envs.checker import EnvCheckError
from starpo.envs.policies import make_policy
from starpo.rollout.prompts import task_description


class GuessEnv(TextEnv):
    """Guess a hidden number from 1 to 9; a wrong guess is told "higher" or "lower"."""

    description = "guess the number"
    instruction = "Guess the hidden number from 1 to 9."
    answer_format = "a whole number from 1 to 9"
    reward_range = (0.0, 1.0)

    def __init__(self) -> None:
        super().__init__(max_steps=4)
        self.target = 0
        self.feedback = ""

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.target = int(self.np_random.integers(1, 10))
        self.feedback = "No guess yet."
        return {}

    def parse_action(self, action: Any) -> int | None:
        if not isinstance(action, str) or not action.strip().isdigit():
            return None
        number = int(action.strip())
        return number if 1 <= number <= 9 else None

    def action_label(self, action: int) -> str:
        return str(action)

    def sample_action(self, rng: np.random.Generator) -> str:
        return str(int(rng.integers(1, 10)))

    def _step(self, action: int) -> tuple[float, bool, bool, dict[str, Any]]:
        hit = action == self.target
        self.feedback = "Right!" if hit else ("Higher." if action < self.target else "Lower.")
        return float(hit), hit, True, {}

    def render(self) -> str:
        return self.feedback

    def snapshot(self) -> Any:
        return (self.target, self.feedback)

    def is_success(self) -> bool:
        return self.feedback == "Right!"


def test_a_free_text_env_passes_the_checker_and_steps_with_its_own_parser():
    env = GuessEnv()
    assert env.free_text and "invalid actions" in check_env(env)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(f" {env.target} ")
    assert (reward, terminated, info["action"], obs) == (1.0, True, str(env.target), "Right!")


def test_an_invalid_free_text_answer_changes_nothing_and_uses_no_budget():
    env = GuessEnv()
    env.reset(seed=0)
    obs, reward, _, _, info = env.step("ten")
    assert (obs, reward, info["action_is_valid"], info["action"]) == (
        "No guess yet.",
        0.0,
        False,
        None,
    )
    assert env.steps_left == 4


class NoFormat(GuessEnv):
    answer_format = ""


class NoSampler(GuessEnv):
    sample_action = TextEnv.sample_action


class SpaceSensitive(GuessEnv):
    def parse_action(self, action: Any) -> int | None:
        if isinstance(action, str) and action != action.strip():
            return None
        return super().parse_action(action)


class AcceptsBlank(GuessEnv):
    def parse_action(self, action: Any) -> int | None:
        return 5 if action == "" else super().parse_action(action)


@pytest.mark.parametrize(
    "env_class, message",
    [
        (NoFormat, "answer_format"),
        (NoSampler, "must implement sample_action"),
        (SpaceSensitive, "surrounding spaces"),
        (AcceptsBlank, "invalid action ''"),
    ],
)
def test_the_checker_names_what_a_free_text_env_gets_wrong(env_class, message):
    with pytest.raises(EnvCheckError, match=message):
        check_env(env_class())


def test_prompt_play_and_random_policy_use_the_answer_hooks():
    env = GuessEnv()
    text = task_description(env, max_actions_per_turn=1)
    assert "Answer with a whole number from 1 to 9." in text
    assert "available actions" not in text
    assert "Answer with a whole number" in describe(env)
    policy = make_policy("random", seed=3)
    env.reset(seed=0)
    answers = {policy(env) for _ in range(40)}
    assert answers <= {str(n) for n in range(1, 10)} and len(answers) > 3
    out = io.StringIO()
    play_interactive(env, seed=0, stdin=io.StringIO("zero\nquit\n"), stdout=out)
    assert "not an action: 'zero'. Answer with a whole number" in out.getvalue()
