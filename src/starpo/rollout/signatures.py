"""Tool schemas as one signature line each: the compact tool listing of
`rollout.tool_format=signatures` (see `prompts.tools_block`).

A tool's OpenAI function schema becomes one line that says the same about a valid call
in fewer tokens (invoice's `search_ledger`, one line in the prompt):

    search_ledger(vendor_id: string (e.g. "V-102", ""), invoice_number?: string) --
    Invoices already processed for a vendor id, optionally only one invoice number.

The notation, for the JSON-schema subset tool envs check
(`starpo.envs.tools`):
- `name: type` a required argument, `name?: type` an optional one; `...` closes the list
  of an object that takes other keys (`additionalProperties: true`);
- types: string, integer, number, boolean, null, `any` (no type), `a|b` (a list of types);
  `{x: T, y?: U}` an object, `{}` one that takes no keys; `[T]` an array of T;
- `"a"|"b"` an enum (its values in JSON, the type they imply left out), `"a"` a const;
- bounds after the type: `>= 1`, `<= 9`, `> 0`, `< 1`, both inclusive ones as `in 0..9`;
- the rest in parentheses after it: the argument's description, `e.g.` its examples,
  `default` its default, and any other keyword as `key=value` (JSON), so nothing a schema
  tells the agent is dropped;
- the tool's description after ` -- `, whole (its whitespace made single spaces, so the
  line stays one line; none is cut to a sentence).

Pure functions of the schema; no call syntax here: the agent still writes its calls as
JSON (`prompts.TOOL_CALL_SHAPE`), which the block around these lines says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Keywords the type text itself renders; any other becomes a note in parentheses.
_RENDERED = frozenset(
    {
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "description",
        "examples",
        "default",
    }
)
#: Bound keywords, as the text that precedes their value.
_BOUNDS = (
    ("minimum", ">="),
    ("exclusiveMinimum", ">"),
    ("maximum", "<="),
    ("exclusiveMaximum", "<"),
)


def tool_signature(schema: Mapping[str, Any]) -> str:
    """One tool's line, `name(arguments) -- description`, from its OpenAI function schema
    (`{"type": "function", "function": {...}}`, as `ToolEnv.tool_schemas` gives) or the
    bare function object."""
    function = schema.get("function", schema)
    parameters = function.get("parameters") or {}
    line = f"{function['name']}({argument_list(parameters)})"
    description = one_line(function.get("description", ""))
    return f"{line} -- {description}" if description else line


def argument_list(schema: Mapping[str, Any]) -> str:
    """An object schema's keys as `a: T, b?: U` (`?`: not required), then `...` where it
    takes other keys. A required key it declares no schema for is `any`."""
    properties = schema.get("properties") or {}
    required = list(schema.get("required") or ())
    names = list(properties) + [name for name in required if name not in properties]
    fields = [
        f"{_key(name)}{'' if name in required else '?'}: {type_text(properties.get(name, {}))}"
        for name in names
    ]
    if schema.get("additionalProperties", False):  # as `read_call` checks it: truthy
        fields.append("...")
    return ", ".join(fields)


def type_text(schema: Mapping[str, Any]) -> str:
    """One argument's schema as its compact type: the values it takes, its bounds, then
    its notes in parentheses (see the module docstring)."""
    text = " ".join(part for part in (_values(schema), _bounds(schema)) if part)
    notes = _notes(schema)
    return f"{text} ({'; '.join(notes)})" if notes else text


def _values(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "|".join(_json(value) for value in schema["enum"])
    if "const" in schema:
        return _json(schema["const"])
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else list(kind or [])
    if not kinds:  # no type: an object or array by its keywords, else anything
        kinds = ["object"] if "properties" in schema else ["array"] if "items" in schema else []
    return "|".join(_kind_text(schema, k) for k in kinds) or "any"


def _kind_text(schema: Mapping[str, Any], kind: str) -> str:
    """One JSON type of `schema`: an object's keys in braces, an array's items in brackets."""
    if kind == "object":
        return f"{{{argument_list(schema)}}}"
    if kind == "array":
        items = schema.get("items")
        return f"[{type_text(items)}]" if isinstance(items, Mapping) else "[any]"
    return kind


def _bounds(schema: Mapping[str, Any]) -> str:
    """`>= a`, `<= b`, `> a`, `< b`; the two inclusive bounds alone as `in a..b`."""
    present = [(key, sign) for key, sign in _BOUNDS if key in schema]
    if [key for key, _ in present] == ["minimum", "maximum"]:
        return f"in {_json(schema['minimum'])}..{_json(schema['maximum'])}"
    return " ".join(f"{sign} {_json(schema[key])}" for key, sign in present)


def _notes(schema: Mapping[str, Any]) -> list[str]:
    """What else the schema says: its description, examples, default, other keywords. An
    array's `items` that is no schema (a tuple of them) is kept as a keyword too."""
    notes = []
    if schema.get("description"):
        notes.append(one_line(schema["description"]))
    if schema.get("examples"):
        notes.append("e.g. " + ", ".join(_json(e) for e in schema["examples"]))
    if "default" in schema:
        notes.append(f"default {_json(schema['default'])}")
    other = [key for key in schema if key not in _RENDERED]
    if "items" in schema and not isinstance(schema["items"], Mapping):
        other.append("items")
    notes += [f"{key}={_json(schema[key])}" for key in other]
    return notes


def _key(name: str) -> str:
    """An argument name as written: bare when it is an identifier, else quoted (JSON)."""
    return name if name.isidentifier() else _json(name)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def one_line(text: Any) -> str:
    """`text` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())
