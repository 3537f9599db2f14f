"""Hostile calls against the tool envs (invoice, support) and `read_call`: whatever the agent
writes, every message it is shown is valid UTF-8 of bounded length, `read_call` raises only
ToolCallError, `explain` never raises, and the tools' schemas cannot be changed from outside."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starpo.envs.invoice.env import InvoiceEnv
from starpo.envs.support.env import SupportEnv
from starpo.envs.tools import (
    MAX_RESULT_CHARS,
    Tool,
    ToolCallError,
    ToolEnv,
    read_call,
    sample_arguments,
)

ENVS = (InvoiceEnv, SupportEnv)
#: Longest "Error: ..." any hostile call may produce (a reason, an echo cut to 40
#: characters, and the list of tools).
ERROR_CHARS = 200
SURROGATE = "\ud800"
HOSTILE_TEXTS = (
    SURROGATE,
    "id-" + SURROGATE * 50,
    "k" * 3000,  # a 3,000-character key once gave a 3,049-character error
    "x" * 2000 + SURROGATE,
    "é" * 1500,
    "ß" * 60,  # upper-cased by the id tools: 120 characters
    "\u202e\x00\x1b[31m",
)


def hostile_calls(tools: tuple[Tool, ...], text: str) -> list[dict[str, Any]]:
    """Calls that put `text` in the tool name, a top-level key, an argument key and each
    argument's value of every tool (the other arguments well formed)."""
    rng = np.random.default_rng(0)
    calls: list[dict[str, Any]] = [{"name": text, "arguments": {}}]
    for tool in tools:
        good = {k: sample_arguments(s, rng) for k, s in tool.parameters["properties"].items()}
        calls.append({"name": tool.name, "arguments": good, text: 1})
        calls.append({"name": tool.name, "arguments": {**good, text: 1}})
        calls += [{"name": tool.name, "arguments": {**good, k: text}} for k in good]
    return calls


def assert_readable(text: Any, limit: int) -> None:
    assert isinstance(text, str)
    text.encode("utf-8")  # raises on a lone surrogate
    assert len(text) <= limit, (len(text), text[:80])


def step_checked(env: ToolEnv, seed: int, call: Any) -> str:
    """Step `call` (resetting first when the last call ended the episode); the result,
    checked readable and bounded, and explain() checked never to raise."""
    if env.done:
        env.reset(seed=seed)
    why = env.explain(call)
    if why is not None:
        assert_readable(why, MAX_RESULT_CHARS)
    *_, info = env.step(call)
    result = info["tool_result"]
    assert_readable(result, MAX_RESULT_CHARS)
    if result.startswith("Error"):
        assert_readable(result, ERROR_CHARS)
    json.dumps(info, ensure_ascii=False).encode("utf-8")  # a run file can hold it
    return result


@pytest.mark.parametrize("env_cls", ENVS)
@pytest.mark.parametrize("text", HOSTILE_TEXTS)
def test_every_result_is_valid_utf8_and_bounded(env_cls: type[ToolEnv], text: str):
    env = env_cls()
    env.reset(seed=3)
    for call in hostile_calls(env_cls.tools, text):
        step_checked(env, 3, call)  # as a parsed mapping (an API's native call)
        as_text = json.dumps(call)  # pure ASCII: a surrogate is written \ud800
        if len(as_text) <= 4000:
            step_checked(env, 3, as_text)


def test_the_reported_surrogate_key_is_escaped_and_a_long_key_cut():
    env = InvoiceEnv()
    env.reset(seed=0)
    *_, info = env.step('{"name": "get_tax_rate", "arguments": {}, "\\ud800": 1}')
    assert info["tool_result"] == 'Error: a call holds only name and arguments, not "\\ud800"'
    *_, info = env.step(json.dumps({"name": "get_tax_rate", "arguments": {}, "k" * 3000: 1}))
    assert info["tool_result"].endswith('not "' + "k" * 36 + "...")  # 40 characters shown


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    env_index=st.integers(0, 1),
    tool_index=st.integers(0, 7),
    key=st.text(max_size=50),
    value=st.one_of(st.text(max_size=80), st.integers(), st.floats(), st.none(), st.booleans()),
    where=st.sampled_from(["name", "top", "argument key", "argument value"]),
)
def test_any_text_anywhere_in_a_call_is_answered_readably(env_index, tool_index, key, value, where):
    env = ENVS[env_index]()
    env.reset(seed=1)
    tool = env.tools[tool_index % len(env.tools)]
    arguments = sample_arguments(tool.parameters, np.random.default_rng(tool_index))
    call: dict[str, Any] = {"name": tool.name, "arguments": arguments}
    if where == "name":
        call["name"] = value
    elif where == "top":
        call[key] = value
    elif where == "argument key":
        arguments[key] = value
    else:
        arguments.update(dict.fromkeys(tool.parameters["properties"], value))
    step_checked(env, 1, call)
    step_checked(env, 1, json.dumps(call))


class EchoEnv(ToolEnv):
    """A subclass that echoes what it is given, unguarded: the base class must still hand
    the agent readable text."""

    tools = (
        Tool("echo", "Echo.", {"type": "object", "properties": {"n": {"type": "integer"}}}),
        Tool("stop", "Stop.", ends_episode=True),
    )

    def __init__(self) -> None:
        super().__init__(max_steps=5)

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        return {}

    def render(self) -> str:
        return ""

    def snapshot(self) -> Any:
        return ""

    def state_key(self) -> Any:
        return ""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        return (SURROGATE + "y") * 5000

    def final_reward(self) -> float:
        return 0.0

    def is_success(self) -> bool:
        return False


def test_the_base_class_guards_whatever_a_subclass_returns():
    env = EchoEnv()
    env.reset(seed=0)
    *_, info = env.step('{"name": "echo", "arguments": {"n": 1}}')
    assert_readable(info["tool_result"], MAX_RESULT_CHARS)
    assert info["tool_result"].startswith("\\ud800y")


# ------------------------------------------------------------------ read_call's contract
DEEP = "[" * 990 + "]" * 990  # ~2,000 characters that json.loads still accepts
#: A tool of each env taking one string argument (`read_call` checks the name first).
LOOKUP = {InvoiceEnv: ("search_vendors", "name"), SupportEnv: ("get_order", "order_id")}
# (what the call is, the call from (tool, its argument), the reason the error must give)
CONTRACT_CASES = [
    ("deep name", lambda t, a: '{"name": ' + DEEP + "}", "nested too deeply"),
    ("deep argument", lambda t, a: f'{{"name": "{t}", "arguments": {{"{a}": {DEEP}}}}}',
     "nested too deeply"),
    ("deep extra key", lambda t, a: f'{{"name": "{t}", "arguments": {{}}, "x": {DEEP}}}',
     "nested too deeply"),
    ("deep objects", lambda t, a: f'{{"name": "{t}", "arguments": ' + '{"a": ' * 500 + "1"
     + "}" * 501, "nested too deeply"),
    ("deep argument text", lambda t, a: f'{{"name": "{t}", "arguments": "' + "[" * 3000 + '"}',
     "arguments are not a JSON object"),
    ("huge number as name", lambda t, a: {"name": 10**5000}, "a number too large"),
    ("huge number as argument", lambda t, a: {"name": t, "arguments": {a: 10**5000}},
     "a number too large"),
    ("huge number as key", lambda t, a: {"name": t, "arguments": {}, 10**5000: 1},
     "a number too large"),
    ("huge negative number", lambda t, a: {"name": t, "arguments": {a: -(10**5000)}},
     "a number too large"),
    ("3,900 digits in text", lambda t, a: f'{{"name": "{t}", "arguments": {{"{a}": '
     + "9" * 3900 + "}}", "a number too large"),
    ("long argument text", lambda t, a: {"name": t, "arguments": "[" + "9" * 5000 + "]"},
     "longer than 4000"),
    ("bytes name", lambda t, a: {"name": t.encode(), "arguments": {}}, "name must be a string"),
    ("list name", lambda t, a: {"name": [t], "arguments": {}}, "name must be a string"),
    ("no name", lambda t, a: {"arguments": {a: "x"}}, "names no tool"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make_call", "reason"),
    [case[1:] for case in CONTRACT_CASES],
    ids=[case[0] for case in CONTRACT_CASES],
)
def test_read_call_raises_only_tool_call_errors_that_say_why(make_call: Any, reason: str):
    for env_cls in ENVS:
        action = make_call(*LOOKUP[env_cls])
        with pytest.raises(ToolCallError, match=reason):
            read_call(action, env_cls.tools)
        env = env_cls()
        env.reset(seed=0)
        assert env.explain(action) is None
        assert reason in step_checked(env, 0, action)


def test_a_mapping_that_holds_itself_is_refused_not_recursed():
    call: dict[str, Any] = {"name": "get_tax_rate"}
    call["arguments"] = call
    with pytest.raises(ToolCallError, match="nested too deeply"):
        read_call(call, InvoiceEnv.tools)
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ToolCallError, match="nested too deeply"):
        read_call({"name": "search_vendors", "arguments": {"name": looped}}, InvoiceEnv.tools)


def test_explain_never_raises_on_any_action():
    for env_cls in ENVS:
        env = env_cls()
        env.explain('{"name": "get_tax_rate", "arguments": {}}')  # before any reset
        env.reset(seed=0)
        hostile = (None, 3.5, b"x", ["a"], {"name": {}}, {1: 2}, "\ud800", DEEP, {"name": 10**5000})
        for action in hostile:
            assert env.explain(action) is None


# ------------------------------------------------------------------------------ schemas
@pytest.mark.parametrize("env_cls", ENVS)
def test_editing_a_handed_out_schema_changes_nothing(env_cls: type[ToolEnv]):
    tool = next(t for t in env_cls.tools if "name" in t.parameters["properties"]
                or "email" in t.parameters["properties"])  # fmt: skip
    key = next(iter(tool.parameters["properties"]))
    call = json.dumps({"name": tool.name, "arguments": {key: "x"}})
    before = [json.dumps(s, sort_keys=True) for s in env_cls.tool_schemas()]
    for schemas in (env_cls.tool_schemas(), [t.schema() for t in env_cls.tools]):
        for schema in schemas:
            parameters = schema["function"]["parameters"]
            for spec in parameters["properties"].values():
                spec["type"] = "integer"
            parameters["required"] = ["nothing"]
            parameters["properties"]["added"] = {"type": "string"}
    assert [json.dumps(s, sort_keys=True) for s in env_cls.tool_schemas()] == before
    env = env_cls()
    env.reset(seed=0)
    assert read_call(call, env.tools).arguments == {key: "x"}
    *_, info = env.step(call)
    assert info["action_is_valid"], info["tool_result"]


def test_a_tool_keeps_its_own_copy_of_the_schema_it_was_given():
    shared = {"type": "string"}
    parameters = {"type": "object", "properties": {"a": shared}, "required": ["a"]}
    tool = Tool("t", "T.", parameters)
    shared["type"] = "integer"
    parameters["required"].append("b")
    assert read_call({"name": "t", "arguments": {"a": "x"}}, [tool]).arguments == {"a": "x"}
