"""Tool-calling envs: tools declared as OpenAI function schemas, calls read and checked
against them, and `ToolEnv`, the base class of an env whose actions are tool calls.

An agent's turn holds one or more calls, each a JSON object
`{"name": "lookup_vendor", "arguments": {"vendor_id": "V-102"}}`; the rollout engine reads
them out of the reply (`<tool_call>...</tool_call>` blocks, `starpo.rollout.parser`) and
steps the env with each one's text. The env reads the call (`read_call`): text that is not
a JSON object, an unknown tool, or arguments that break the tool's schema make the call
invalid: it changes nothing and uses no budget, as an invalid action in any env, and
`info["tool_result"]` says what was wrong ("Error: ...") so the agent can see it in the
next turn. A well-formed call runs the tool (`ToolEnv.call_tool`); its text result comes
back in `info["tool_result"]`. A tool declared `ends_episode` (submit, resolve) ends the
episode, and the env scores the final state against the case's gold state
(`ToolEnv.final_reward`), never the agent's text.

The schemas follow JSON Schema's subset that function calling uses: `type` (object,
string, integer, number, boolean, array, null), `properties`, `required`, `enum`,
`items`, `minimum` / `maximum`; an object takes no keys besides its `properties` unless
it says `additionalProperties: true`. Other keywords (`description`, `examples`) are shown
to the agent and not checked. Stdlib only (no jsonschema dependency).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from starpo.envs.base import TextEnv

#: Longest call text read (a runaway generation is not parsed).
MAX_CALL_CHARS = 4000

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what it does, its arguments as a JSON schema (an object), and
    whether calling it ends the episode (a final submit or resolve)."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    ends_episode: bool = False

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (`tools=[...]` of a chat request or template)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class ToolCall:
    """A call that names a declared tool, with arguments its schema accepts."""

    name: str
    arguments: dict[str, Any]

    def text(self) -> str:
        """The canonical text of the call (as the agent writes it inside <tool_call>)."""
        return call_text(self.name, self.arguments)


def call_text(name: str, arguments: Mapping[str, Any], key: str = "arguments") -> str:
    """`{"name": ..., "arguments": {...}}` as one line of JSON (`key`: the arguments' key,
    one of ARGUMENT_KEYS)."""
    return json.dumps({"name": name, key: dict(arguments)}, ensure_ascii=False)


#: The keys a call may hold its arguments under (OpenAI and Hermes: "arguments"; Llama 3.1:
#: "parameters").
ARGUMENT_KEYS = ("arguments", "parameters")


class ToolCallError(ValueError):
    """Why a call cannot run, worded for the agent (it reads it in the next turn)."""


# ----------------------------------------------------------------------- reading calls


def read_call(action: Any, tools: Sequence[Tool]) -> ToolCall:
    """The call `action` makes (its JSON text, or an already parsed mapping); raises
    ToolCallError with what is wrong. Never raises anything else, whatever `action` is."""
    if isinstance(action, str):
        if len(action) > MAX_CALL_CHARS:
            raise ToolCallError(f"the call is longer than {MAX_CALL_CHARS} characters")
        try:
            action = json.loads(action)
        except (json.JSONDecodeError, RecursionError) as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise ToolCallError(f"the call is not valid JSON ({why})") from None
    if not isinstance(action, Mapping):
        raise ToolCallError('a call is a JSON object: {"name": ..., "arguments": {...}}')
    # Llama 3.1's templates name the arguments "parameters": either key, not both.
    unknown_keys = sorted(str(k) for k in action if k not in ("name", *ARGUMENT_KEYS))
    if unknown_keys:
        raise ToolCallError(f"a call holds only name and arguments, not {unknown_keys[0]}")
    if all(key in action for key in ARGUMENT_KEYS):
        raise ToolCallError("a call holds its arguments once: arguments or parameters, not both")
    by_name = {tool.name: tool for tool in tools}
    name = action.get("name")
    if not isinstance(name, str) or name not in by_name:
        names = ", ".join(by_name)
        shown = json.dumps(name)[:60] if name is not None else "no name"
        raise ToolCallError(f"unknown tool {shown}; the tools are: {names}")
    arguments = action.get("arguments", action.get("parameters", {}))
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            raise ToolCallError(f"{name}: arguments are not a JSON object") from None
    if not isinstance(arguments, Mapping):
        raise ToolCallError(f"{name}: arguments must be a JSON object")
    problem = schema_problem(by_name[name].parameters, arguments, "")
    if problem is not None:
        raise ToolCallError(f"{name}: {problem}")
    try:  # JSON may carry a lone surrogate ("\ud800"), which no record could be written with
        json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ToolCallError(f"{name}: arguments hold text that is not valid Unicode") from None
    return ToolCall(name, as_declared(by_name[name].parameters, dict(arguments)))


def as_declared(schema: Mapping[str, Any], value: Any) -> Any:
    """`value` (checked against `schema`) with whole numbers written as 3.0 made integers
    where the schema declares an integer, so a tool receives the type it declared."""
    if schema.get("type") == "integer" and isinstance(value, float):
        return int(value)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        return {k: as_declared(properties.get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_declared(schema.get("items", {}), item) for item in value]
    return value


def _is_type(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False  # JSON's true is no number
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    if kind == "number" and isinstance(value, float):
        return np.isfinite(value)
    return isinstance(value, _JSON_TYPES.get(kind, ()))


def schema_problem(schema: Mapping[str, Any], value: Any, where: str) -> str | None:
    """What `value` breaks of `schema` (the JSON-schema subset above), or None; `where`
    names the place in the arguments ("" = the arguments themselves)."""
    label = f"argument {where}" if where else "arguments"
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else list(kind or [])
    if kinds and not any(_is_type(value, k) for k in kinds):
        return f"{label} must be {' or '.join(kinds)}, got {_shown(value)}"
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(c) for c in schema["enum"])
        return f"{label} must be one of {choices}, got {_shown(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{label} must be >= {schema['minimum']}, got {_shown(value)}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{label} must be <= {schema['maximum']}, got {_shown(value)}"
    if isinstance(value, Mapping):
        return _object_problem(schema, value, where)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = schema_problem(schema["items"], item, f"{where}[{i}]")
            if problem is not None:
                return problem
    return None


def _object_problem(schema: Mapping[str, Any], value: Mapping[str, Any], where: str) -> str | None:
    properties = schema.get("properties", {})
    prefix = f"{where}." if where else ""
    for name in schema.get("required", ()):
        if name not in value:
            return f"missing required argument {prefix}{name}"
    for key, item in value.items():
        if key in properties:
            problem = schema_problem(properties[key], item, f"{prefix}{key}")
            if problem is not None:
                return problem
        elif not schema.get("additionalProperties", False):
            known = ", ".join(properties) or "none"
            return f"unknown argument {prefix}{_shown(key)} (the arguments are: {known})"
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    if not text.isascii():  # escaped where it is no valid Unicode (a lone surrogate)
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= 40 else text[:37] + "..."


def sample_arguments(schema: Mapping[str, Any], rng: np.random.Generator) -> Any:
    """A random value the schema accepts (the random baseline's arguments: well formed,
    usually wrong). Strings come from the schema's enum or `examples`, else a short word."""
    kind = schema.get("type", "string")
    kind = kind if isinstance(kind, str) else str(rng.choice(list(kind)))
    if "enum" in schema:
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return {
            name: sample_arguments(sub, rng)
            for name, sub in properties.items()
            if name in required or rng.random() < 0.5
        }
    if kind == "array":
        return [sample_arguments(schema.get("items", {}), rng) for _ in range(rng.integers(3))]
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", 0), schema.get("maximum", 1000)
        value = low + (high - low) * rng.random()
        return int(round(value)) if kind == "integer" else round(float(value), 2)
    if kind == "boolean":
        return bool(rng.integers(2))
    if kind == "null":
        return None
    examples = schema.get("examples") or ["unknown", "none", "x"]
    return str(examples[int(rng.integers(len(examples)))])


# ---------------------------------------------------------------------------- the env


class ToolError(Exception):
    """Raised by `call_tool` for a well-formed call the case cannot serve (no such record,
    an action the state forbids); the agent reads "Error: <message>" as the tool's result.
    The call was valid (it used a step) and changed nothing."""


class ToolEnv(TextEnv):
    """An env whose actions are tool calls (see the module docstring).

    A subclass declares `tools`, builds its case in `_reset`, and implements `call_tool`
    (run one well-formed call on the case's state; return the result text, or raise
    ToolError), `render` (the case as the agent first reads it: a document, a request),
    `snapshot` (the comparable state, e.g. its database), `final_reward` (the score of the
    final state against the gold one, in [0, 1]) and `is_success`. Optional:
    `optimal_action` (the gold solver's next call as text) and `explain`.
    """

    #: The tools the agent may call; one or more `ends_episode`.
    tools: ClassVar[tuple[Tool, ...]] = ()
    answer_format = 'tool calls, each <tool_call>{"name": ..., "arguments": {...}}</tool_call>'

    def __init__(self, max_steps: int) -> None:
        super().__init__(max_steps)
        self._call_error = ""  # why the last call was invalid, for its info

    # ------------------------------------------------------------- subclass hooks
    @abstractmethod
    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one well-formed call on the case's state; the result text (JSON is usual)."""

    @abstractmethod
    def final_reward(self) -> float:
        """The score of the state now against the case's gold state, in [0, 1]."""

    # ------------------------------------------------------------- TextEnv hooks
    def parse_action(self, action: Any) -> ToolCall | None:
        try:
            call = read_call(action, self.tools)
        except ToolCallError as exc:
            self._call_error = str(exc)
            return None
        except Exception as exc:  # noqa: BLE001 - reading a call never raises
            self._call_error = f"the call cannot be read ({type(exc).__name__})"
            return None
        return call

    def action_label(self, action: ToolCall) -> str:
        return action.text()

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random tool with random well-formed arguments."""
        tool = self.tools[int(rng.integers(len(self.tools)))]
        return call_text(tool.name, sample_arguments(tool.parameters, rng))

    def _step(self, action: ToolCall) -> tuple[float, bool, bool, dict[str, Any]]:
        tool = next(t for t in self.tools if t.name == action.name)
        try:
            result, ran = self.call_tool(action.name, dict(action.arguments)), True
        except ToolError as exc:
            result, ran = f"Error: {exc}", False
        ends = tool.ends_episode and ran
        reward = float(self.final_reward()) if ends else 0.0
        return reward, ends, ran, {"tool_result": result}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """TextEnv.step, plus `info["tool_result"]`: the call's result, or for an invalid
        call "Error: <what is wrong>" (the env itself is left as it was)."""
        obs, reward, terminated, truncated, info = super().step(action)
        if not info["action_is_valid"]:
            info["tool_result"] = f"Error: {self._call_error}"
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------- for prompts
    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """Every tool's OpenAI function schema."""
        return [tool.schema() for tool in cls.tools]


def is_tool_env(env: Any) -> bool:
    """Whether `env` (an instance or class) takes tool calls: a ToolEnv, or an env that
    learns its tools as it plays and lists them in `tool_schemas()` (a remote OpenEnv
    server's, after its first reset)."""
    if isinstance(env, type):
        return issubclass(env, ToolEnv)
    schemas = getattr(env, "tool_schemas", None)
    return isinstance(env, ToolEnv) or (callable(schemas) and bool(schemas()))
