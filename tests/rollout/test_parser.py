"""The turn parser: never raises, recovers well-formed turns exactly, rejects the rest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from starpo.rollout.parser import TAGS, parse_turn

# Free text without tags or the action separator (what a thought or an action may hold).
plain_text = st.text(
    alphabet=st.characters(blacklist_characters="<>|", blacklist_categories=["Cs"]), max_size=40
)
action = plain_text.map(str.strip).filter(bool)


def test_examples():
    parsed = parse_turn("<think>box is left</think> <answer>Left || Up</answer>")
    assert parsed.format_ok and parsed.think == "box is left" and parsed.actions == ("Left", "Up")
    assert parse_turn("<answer>Up</answer>", think=False).actions == ("Up",)
    assert not parse_turn("<answer>Up</answer>").format_ok  # thinking required
    assert not parse_turn("<think>a</think><answer>Up</answer> and more").format_ok
    assert not parse_turn("<think>a</think><answer>Up</answer><answer>Down</answer>").format_ok
    assert not parse_turn("<think>a</think><answer> || </answer>").format_ok  # no action
    assert not parse_turn("<think>a<think>b</think><answer>Up</answer>").format_ok
    assert not parse_turn("").format_ok


@given(st.text(max_size=300))
@settings(max_examples=300)
def test_never_raises_and_malformed_has_no_actions(text: str):
    parsed = parse_turn(text)
    assert isinstance(parsed.format_ok, bool)
    if not parsed.format_ok:
        assert parsed.actions == ()
    else:
        assert all(tag not in "".join(parsed.actions) for tag in TAGS)


@given(
    plain_text,
    st.lists(action, min_size=1, max_size=9),
    st.integers(1, 7),
    st.sampled_from(["", " ", "\n", "\n\n "]),
)
def test_well_formed_turns_round_trip(thought: str, actions: list[str], max_actions: int, gap: str):
    text = f"<think>{thought}</think>{gap}<answer>{' || '.join(actions)}</answer>{gap}"
    parsed = parse_turn(text, max_actions=max_actions)
    assert parsed.format_ok
    assert parsed.think == thought.strip()
    assert parsed.actions == tuple(actions[:max_actions])
    assert parsed.num_dropped_actions == max(0, len(actions) - max_actions)


@given(plain_text, st.lists(action, min_size=1, max_size=5), plain_text.filter(str.strip))
def test_text_outside_the_blocks_is_malformed(thought: str, actions: list[str], extra: str):
    answer = f"<answer>{'||'.join(actions)}</answer>"
    assert not parse_turn(f"{extra}<think>{thought}</think>{answer}").format_ok
    assert not parse_turn(f"<think>{thought}</think>{answer}{extra}").format_ok


@given(st.one_of(st.none(), st.integers(), st.binary()))
def test_non_text_input_is_malformed(value):
    assert not parse_turn(value).format_ok  # type: ignore[arg-type]


# ------------------------------------------------------------------ tool-calling turns
def test_tool_turn_examples():
    from starpo.rollout.parser import parse_tool_turn

    two = parse_tool_turn(
        '<think>look</think> <tool_call>{"a": 1}</tool_call>\n<tool_call>x</tool_call>'
    )
    assert two.format_ok and two.think == "look" and two.actions == ('{"a": 1}', "x")
    assert parse_tool_turn("<tool_call>{}</tool_call>", think=False).actions == ("{}",)
    assert not parse_tool_turn("<tool_call>{}</tool_call>").format_ok  # thinking required
    assert not parse_tool_turn("<think>a</think> I call it <tool_call>{}</tool_call>").format_ok
    assert not parse_tool_turn("<think>a</think><tool_call>{}</tool_call> done").format_ok
    assert not parse_tool_turn("<think>a</think><tool_call>{}").format_ok  # never closed
    assert not parse_tool_turn("<think>a</think><tool_call><tool_call>{}</tool_call>").format_ok
    assert not parse_tool_turn("<think>a</think><answer>Up</answer>").format_ok
    assert not parse_tool_turn("<think>a</think>").format_ok  # no call
    kept = parse_tool_turn("<think>a</think>" + "<tool_call>{}</tool_call>" * 4, max_calls=3)
    assert len(kept.actions) == 3 and kept.num_dropped_actions == 1


@given(st.text(max_size=300), st.booleans())
@settings(max_examples=300)
def test_any_text_parses_as_a_tool_turn_without_raising(text, think):
    from starpo.rollout.parser import parse_tool_turn

    parsed = parse_tool_turn(text, think=think, max_calls=3)
    assert parsed.format_ok == bool(parsed.actions) and len(parsed.actions) <= 3
    assert all("<tool_call>" not in a and "</tool_call>" not in a for a in parsed.actions)
