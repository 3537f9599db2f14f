"""The exact prompt text (RAGEN's layout): first and next user messages, the format
reminder with and without thinking, and the text the generation prompt ends with."""

from __future__ import annotations

import pytest

from starpo.envs import make
from starpo.rollout.prompts import (
    SYSTEM_PROMPT,
    first_user_message,
    format_instruction,
    generation_prefix,
    next_user_message,
    task_description,
)


class StubEnv:
    """Just what prompts read from an env."""

    instruction = "Push the box onto the target."
    legend = {"#": "wall", "P": "player"}
    action_names = ("Up", "Down")

    def legend_text(self) -> str:
        return "# wall, P player"


THINK_FORMAT = (
    "Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
    "with no extra text. Strictly follow this format. Max response length: 100 words (tokens)."
)
ANSWER_FORMAT = (
    "Always output: <answer> [your answer] </answer> "
    "with no extra text. Strictly follow this format. Max response length: 50 words (tokens)."
)


def test_system_prompt():
    assert SYSTEM_PROMPT == "You're a helpful assistant."


def test_format_instruction_with_and_without_thinking():
    assert format_instruction(think=True, max_response_words=100) == THINK_FORMAT
    assert format_instruction(think=False, max_response_words=50) == ANSWER_FORMAT
    assert "<think>" not in format_instruction(think=False, max_response_words=50)


def test_first_user_message_exact_text():
    text = first_user_message(
        StubEnv(),
        "#P#",
        max_actions_per_turn=3,
        actions_left=10,
        think=True,
        max_response_words=100,
    )
    assert text == (
        "Push the box onto the target.\n"
        "The meaning of each symbol in the state is: # wall, P player\n"
        "Your available actions are: Up, Down. You can make up to 3 actions, separated by ||.\n"
        "Turn 1:\nState:\n#P#\nYou have 10 actions left. " + THINK_FORMAT
    )


def test_first_user_message_without_legend_or_thinking():
    env = StubEnv()
    env.legend = {}
    text = first_user_message(
        env, "x", max_actions_per_turn=1, actions_left=1, think=False, max_response_words=50
    )
    assert text == (
        "Push the box onto the target.\n"
        "Your available actions are: Up, Down. You can make up to 1 actions, separated by ||.\n"
        "Turn 1:\nState:\nx\nYou have 1 actions left. " + ANSWER_FORMAT
    )


@pytest.mark.parametrize(("reward", "shown"), [(0.0, "0"), (1.0, "1"), (-0.1, "-0.1"), (10, "10")])
def test_next_user_message_exact_text(reward, shown):
    text = next_user_message(3, reward, "_O_", actions_left=4, think=True, max_response_words=100)
    assert text == f"Reward:\n{shown}\nTurn 3:\nState:\n_O_\nYou have 4 actions left. " + (
        THINK_FORMAT
    )


def test_next_user_message_without_the_format_reminder():
    text = next_user_message(
        3, -0.1, "_O_", actions_left=4, think=True, max_response_words=100, remind=False
    )
    assert text == "Reward:\n-0.1\nTurn 3:\nState:\n_O_\nYou have 4 actions left."


def test_task_description_states_the_per_turn_cap():
    text = task_description(StubEnv(), max_actions_per_turn=5)
    assert text.endswith("You can make up to 5 actions, separated by ||.")
    assert text.count("\n") == 2  # instruction, legend, actions


def test_a_registered_env_fills_in_its_own_instruction_legend_and_actions():
    env = make("frozenlake")
    state, _ = env.reset(seed=0)
    text = first_user_message(
        env, state, max_actions_per_turn=2, actions_left=7, think=True, max_response_words=100
    )
    lines = text.split("\n")
    assert text.startswith(env.instruction + "\n")
    assert f"The meaning of each symbol in the state is: {env.legend_text()}" in lines
    assert f"Your available actions are: {', '.join(env.action_names)}." in text
    assert text.endswith(f"Turn 1:\nState:\n{state}\nYou have 7 actions left. {THINK_FORMAT}")


def test_generation_prefix():
    assert generation_prefix(True) == "<think>"
    assert generation_prefix(False) == "<answer>"
