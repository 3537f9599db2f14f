"""Hypothesis fuzzes action strings: nothing raises, invalid input changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starpo.envs import make, standalone_ids

BUILTIN_IDS = ["bandit", "bandit-rev", "frozenlake", "sokoban", "sokoban-large", "sokoban-newvocab"]
# Free-text envs judge any text themselves (a wrong answer may be valid): fuzzed on their
# own rule, parse_action.
FREE_TEXT_IDS = [i for i in standalone_ids() if make(i).free_text]

action_strings = st.one_of(
    st.text(max_size=50),  # any unicode, incl. surrogates
    st.text(alphabet=st.characters(categories=["Cc", "Cf", "Zs"]), max_size=30),  # control chars
    st.builds(lambda n: "x" * n, st.integers(0, 200_000)),  # huge strings
    st.sampled_from(
        ["<answer>Up</answer>", "<think>", "Up || Left", "UP\n", "<script>", "\u202eUp"]
    ),
    st.sampled_from(["Up", "down", " LEFT ", "Right", "Dragon", "phoenix"]),  # sometimes valid
)


def step_checked(env, action: str, valid: bool) -> dict:
    """Step `action` from seed 7's start: nothing raises, the result is well typed, its
    validity is `valid`, an invalid action changes nothing and a valid one uses one action
    of the budget (unless it ended the episode). Returns the step's info."""
    before = (env.render(), env.snapshot(), env.steps_left)
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str) and isinstance(reward, float)
    assert info["action_is_valid"] is valid
    if not valid:
        assert (obs, env.snapshot(), env.steps_left) == before
        assert reward == 0.0 and not terminated and not truncated
    else:
        assert env.steps_left == before[2] - 1 or terminated or truncated
    return info


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(action=action_strings)
def test_any_action_string_is_handled(env_id: str, action: str):
    env = make(env_id)
    env.reset(seed=7)
    valid = env.action_index(action) is not None
    info = step_checked(env, action, valid)
    if valid:
        assert info["action"].casefold() == action.strip().casefold()


free_text_strings = st.one_of(
    action_strings,
    st.sampled_from(["(3+5)*2", "3+5-2", "r2c3=4", "(2,3)=4", "72", "$1,234.50", "3/4"]),
    st.text(alphabet="0123456789+-*/() =rc,.", max_size=40),  # near-misses of answers
)


@pytest.mark.parametrize("env_id", FREE_TEXT_IDS)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=free_text_strings)
def test_any_free_text_answer_is_handled(env_id: str, answer: str):
    env = make(env_id)
    env.reset(seed=7)
    parsed = env.parse_action(answer)  # before the step: it may read the state (a free cell)
    label = None if parsed is None else env.action_label(parsed)
    info = step_checked(env, answer, parsed is not None)
    assert info["action"] == label
