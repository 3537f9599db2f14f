"""Hypothesis fuzzes action strings: nothing raises, invalid input changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starpo.envs import make

BUILTIN_IDS = ["bandit", "bandit-rev", "frozenlake", "sokoban", "sokoban-large", "sokoban-newvocab"]

action_strings = st.one_of(
    st.text(max_size=50),  # any unicode, incl. surrogates
    st.text(alphabet=st.characters(categories=["Cc", "Cf", "Zs"]), max_size=30),  # control chars
    st.builds(lambda n: "x" * n, st.integers(0, 200_000)),  # huge strings
    st.sampled_from(
        ["<answer>Up</answer>", "<think>", "Up || Left", "UP\n", "<script>", "\u202eUp"]
    ),
    st.sampled_from(["Up", "down", " LEFT ", "Right", "Dragon", "phoenix"]),  # sometimes valid
)


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(action=action_strings)
def test_any_action_string_is_handled(env_id: str, action: str):
    env = make(env_id)
    env.reset(seed=7)
    before = (env.render(), env.snapshot(), env.steps_left)
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str) and isinstance(reward, float)
    valid = env.action_index(action) is not None
    assert info["action_is_valid"] is valid
    if not valid:
        assert (obs, env.snapshot(), env.steps_left) == before
        assert reward == 0.0 and not terminated and not truncated
    else:
        assert info["action"].casefold() == action.strip().casefold()
