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

import copy
import json
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from starpo.envs.base import TextEnv

#: Longest call text read (a runaway generation is not parsed).
MAX_CALL_CHARS = 4000
#: Deepest nesting a call may have. Real calls nest 3 or 4 levels; the bound keeps every
#: recursive check (and json.dumps) far below Python's recursion limit, which a 4,000-character
#: call nested ~990 levels deep would otherwise reach after json.loads accepted it.
MAX_CALL_DEPTH = 32
#: Most decimal digits of a whole number in a call: no tool takes more, and past ~4,300
#: Python refuses to turn an int into text at all (so it could not even be shown).
MAX_NUMBER_DIGITS = 100
#: Longest tool result or error an agent is shown (the tools here answer in under 1,000).
MAX_RESULT_CHARS = 2000
#: Longest piece of the agent's own text echoed back in an error.
MAX_SHOWN_CHARS = 40

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

    def __post_init__(self) -> None:
        # A copy of its own: a schema dict shared with other tools or kept by the caller
        # (a module constant such as {"type": "string"}) must not change how this one checks.
        object.__setattr__(self, "parameters", copy.deepcopy(dict(self.parameters)))

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema (`tools=[...]` of a chat request or template): a
        fresh copy, so that editing it cannot change how calls are checked."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(dict(self.parameters)),
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
    action = _decoded(action, "the call is not valid JSON ({why})")
    if not isinstance(action, Mapping):
        raise ToolCallError('a call is a JSON object: {"name": ..., "arguments": {...}}')
    _check_structure(action, "the call")
    # Llama 3.1's templates name the arguments "parameters": either key, not both.
    unknown_keys = sorted(shown(k) for k in action if k not in ("name", *ARGUMENT_KEYS))
    if unknown_keys:
        raise ToolCallError(f"a call holds only name and arguments, not {unknown_keys[0]}")
    if all(key in action for key in ARGUMENT_KEYS):
        raise ToolCallError("a call holds its arguments once: arguments or parameters, not both")
    by_name = {tool.name: tool for tool in tools}
    names = ", ".join(by_name)
    name = action.get("name")
    if name is None:
        raise ToolCallError(f"the call names no tool; the tools are: {names}")
    if not isinstance(name, str):
        raise ToolCallError(f"the tool name must be a string, got {shown(name)}")
    if name not in by_name:
        raise ToolCallError(f"unknown tool {shown(name)}; the tools are: {names}")
    arguments = action.get("arguments", action.get("parameters", {}))
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        arguments = _decoded(arguments, f"{name}: arguments are not a JSON object")
        _check_structure(arguments, f"{name}: the arguments")
    if not isinstance(arguments, Mapping):
        raise ToolCallError(f"{name}: arguments must be a JSON object")
    problem = schema_problem(by_name[name].parameters, arguments, "")
    if problem is not None:
        raise ToolCallError(f"{name}: {problem}")
    # JSON may carry a lone surrogate ("\ud800"), which no record could be written with.
    if any(isinstance(part, str) and not _is_unicode(part) for part, _ in _parts(arguments)):
        raise ToolCallError(f"{name}: arguments hold text that is not valid Unicode")
    return ToolCall(name, as_declared(by_name[name].parameters, dict(arguments)))


def _decoded(text: Any, invalid: str) -> Any:
    """`text` parsed as JSON when it is a string (anything else as it is); when it cannot
    be, a ToolCallError saying `invalid`, with why in place of its "{why}" if it has one."""
    if not isinstance(text, str):
        return text
    if len(text) > MAX_CALL_CHARS:
        raise ToolCallError(f"the call is longer than {MAX_CALL_CHARS} characters")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        why = exc.msg
    except RecursionError:
        why = "nested too deeply"
    except ValueError:  # a number past Python's int-from-text limit
        why = "a number too large"
    raise ToolCallError(invalid.replace("{why}", why))


def _check_structure(value: Any, what: str) -> None:
    """Raise ToolCallError when `value` nests deeper than MAX_CALL_DEPTH or holds a number
    too large: checked before anything recursive (the schema check, json.dumps) reads it."""
    for part, depth in _parts(value):
        if depth > MAX_CALL_DEPTH:
            raise ToolCallError(f"{what} is nested too deeply (at most {MAX_CALL_DEPTH} levels)")
        if _too_large(part):
            digits = MAX_NUMBER_DIGITS
            raise ToolCallError(f"{what} holds a number too large (over {digits} digits)")


def _parts(value: Any) -> Iterator[tuple[Any, int]]:
    """Every value and key nested in `value`, with its depth (`value` is 0), stopping one
    level past MAX_CALL_DEPTH. Iterative, so that no nesting (nor a mapping that holds
    itself) can reach the recursion limit."""
    stack = [(value, 0)]
    while stack:
        part, depth = stack.pop()
        yield part, depth
        if depth > MAX_CALL_DEPTH:
            continue
        if isinstance(part, Mapping):
            stack.extend((item, depth + 1) for pair in part.items() for item in pair)
        elif isinstance(part, (list, tuple)):
            stack.extend((item, depth + 1) for item in part)


def _too_large(value: Any) -> bool:
    # Compared, not counted with len(str(value)): str() itself raises past ~4,300 digits.
    return isinstance(value, int) and abs(value) >= _TOO_LARGE


_TOO_LARGE = 10**MAX_NUMBER_DIGITS


def _is_unicode(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (it holds no lone surrogate)."""
    return text.isascii() or not any("\ud800" <= ch <= "\udfff" for ch in text)


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
        return f"{label} must be {' or '.join(kinds)}, got {shown(value)}"
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(c) for c in schema["enum"])
        return f"{label} must be one of {choices}, got {shown(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{label} must be >= {schema['minimum']}, got {shown(value)}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{label} must be <= {schema['maximum']}, got {shown(value)}"
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
            return f"unknown argument {prefix}{shown(key)} (the arguments are: {known})"
    return None


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """`value` (the agent's own text, or any value a call held) as an error may echo it:
    JSON, escaped where it is no valid Unicode (a lone surrogate), at most `limit`
    characters. Never raises: a value that cannot be written as JSON is named by its type."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # cut before dumping: a call's string may be long
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except Exception:  # noqa: BLE001 - a huge int, deep nesting, a __str__ that raises
        text = f"a value of type {type(value).__name__}"
    return readable(text, limit)


def readable(text: str, limit: int) -> str:
    """`text` made valid UTF-8 (lone surrogates written as \\udXXX escapes) and cut to
    `limit` characters: what any agent-facing message must be, to be printed, written to
    a run file or tokenized."""
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    `optimal_action` (the gold solver's next call as text), `explain`, and `follows_plan`
    (whether a call is the one the rules call for now: the turn-level reward's judge).

    `turn_reward` > 0 (an env argument, off by default) adds a verifiable reward per turn
    beside the final one: each call that does what the rules call for next (the right
    lookup, with arguments that find the right record; a step of the gold plan) and runs
    earns it, judged before the call changes anything, so a repeated lookup earns nothing.
    The call that ends the episode scores `final_reward` alone.
    """

    #: The tools the agent may call; one or more `ends_episode`.
    tools: ClassVar[tuple[Tool, ...]] = ()
    answer_format = 'tool calls, each <tool_call>{"name": ..., "arguments": {...}}</tool_call>'

    def __init__(self, max_steps: int, turn_reward: float = 0.0) -> None:
        super().__init__(max_steps)
        self.turn_reward = check_turn_reward(turn_reward)
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

    def follows_plan(self, call: ToolCall) -> bool:
        """Whether `call` (well formed, not yet run) is what the rules call for now, as the
        gold solver would make it; an env without a plan says False (no turn reward)."""
        return False

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random tool with random well-formed arguments."""
        tool = self.tools[int(rng.integers(len(self.tools)))]
        return call_text(tool.name, sample_arguments(tool.parameters, rng))

    def _step(self, action: ToolCall) -> tuple[float, bool, bool, dict[str, Any]]:
        tool = next(t for t in self.tools if t.name == action.name)
        # Judged on the state before the call: a lookup counts once, when it is news.
        on_plan = self.turn_reward > 0 and not tool.ends_episode and self.follows_plan(action)
        try:
            result, ran = self.call_tool(action.name, dict(action.arguments)), True
        except ToolError as exc:
            result, ran = f"Error: {exc}", False
        ends = tool.ends_episode and ran
        if ends:
            reward = float(self.final_reward())
        else:
            reward = self.turn_reward if on_plan and ran else 0.0
        return reward, ends, ran, {"tool_result": result}

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """TextEnv.step, plus `info["tool_result"]`: the call's result, or for an invalid
        call "Error: <what is wrong>" (the env itself is left as it was)."""
        obs, reward, terminated, truncated, info = super().step(action)
        if not info["action_is_valid"]:
            info["tool_result"] = f"Error: {self._call_error}"
        # The last guard, whatever a subclass returned: the agent reads this next turn, and
        # a run file, a terminal and a tokenizer all need valid UTF-8 of bounded length.
        info["tool_result"] = readable(str(info["tool_result"]), MAX_RESULT_CHARS)
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------- for prompts
    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """Every tool's OpenAI function schema."""
        return [tool.schema() for tool in cls.tools]  # fresh copies (Tool.schema)


def check_turn_reward(value: Any) -> float:
    """`turn_reward` as a float in [0, 1], or a UserError naming the fix."""
    from starpo.errors import UserError

    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise UserError(
            f"turn_reward must be a number from 0 to 1 (0 = off; e.g. 0.1), got {value!r}"
        )
    return float(value)


def is_tool_env(env: Any) -> bool:
    """Whether `env` (an instance or class) takes tool calls: a ToolEnv, or an env that
    learns its tools as it plays and lists them in `tool_schemas()` (a remote OpenEnv
    server's, after its first reset)."""
    if isinstance(env, type):
        return issubclass(env, ToolEnv)
    schemas = getattr(env, "tool_schemas", None)
    return isinstance(env, ToolEnv) or (callable(schemas) and bool(schemas()))
