"""Config fields and sections, and their mistakes as one-line `UserError`s.

What `starpo.config` builds its sections from, written over any root section class so it
does not import `starpo.config`:
- `config_field` / `config_section`: a field with help, bounds (gt/ge/lt/le), choices,
  example and why; `field_rules` reads them back.
- `ConfigSection`: the pydantic base of every section (strict types, unknown keys refused,
  choices and the section's own `_check`), and `config_root`, which tells every section of a
  tree its root (an unknown key is matched against every key of the tree).
- `validated` / `user_error`: pydantic's first complaint as one line that names the dotted
  key and says what to change (pydantic's own report spans several lines, suggests nothing).
- the YAML dialect values are read and shown in (`1e-6` is a number; `yaml_text`, `show`).

Only stdlib, yaml and pydantic here: `starpo train --help` must not pay for importing torch.
"""

from __future__ import annotations

import copy
import re
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from starpo.errors import UserError, closest_match

BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}  # pydantic's bound -> its sign
_BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")

# --------------------------------------------------------------------------- fields


def config_field(default: Any, help: str, **rules: Any) -> Any:
    """A config field: default, help text, bounds (gt/ge/lt/le, checked by pydantic), and
    `choices`, `example` and `why` (the reason a bound exists, shown when it is broken)."""
    bounds = {k: rules.pop(k) for k in BOUNDS if k in rules}
    kwargs: dict[str, Any] = {"description": help, "json_schema_extra": rules or None, **bounds}
    if isinstance(default, tuple):
        kwargs["strict"] = False  # YAML has no tuples: a list is fine (its items stay strict)
    if isinstance(default, (dict, list)):
        return Field(default_factory=lambda: copy.deepcopy(default), **kwargs)
    return Field(default, **kwargs)


def config_section(cls: type, help: str) -> Any:
    """A field holding a whole section (`help` heads its block in `--help`)."""
    return Field(default_factory=cls, description=help)


def field_rules(info: FieldInfo) -> dict[str, Any]:
    """One field's help, bounds (gt/ge/lt/le) and choices / example / why, as one dict."""
    rules: dict[str, Any] = {"help": info.description or ""}
    for item in info.metadata:  # pydantic keeps bounds as annotated_types.Gt(gt=...) etc.
        rules.update({k: getattr(item, k) for k in BOUNDS if getattr(item, k, None) is not None})
    extra = info.json_schema_extra
    return {**rules, **(extra if isinstance(extra, dict) else {})}


def bounds_text(rules: Mapping[str, Any]) -> str:
    """The bounds of `rules` as text, e.g. '>= 0.0 and <= 1.0' ('' when it has none)."""
    return " and ".join(f"{sign} {rules[k]}" for k, sign in BOUNDS.items() if k in rules)


def _example(info: FieldInfo) -> Any:
    """The value shown after 'e.g.': the declared example, else the plain default."""
    return field_rules(info).get("example", None if info.default_factory else info.default)


def section_type(cls: type[BaseModel], name: Any) -> type[ConfigSection] | None:
    """The section class of field `name` of `cls`; None for a plain value."""
    tp = cls.model_fields[name].annotation
    return tp if isinstance(tp, type) and issubclass(tp, ConfigSection) else None


def leaves(cls: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted key, field) of every setting under `cls`, in declaration order."""
    for name, info in cls.model_fields.items():
        section = section_type(cls, name)
        if section is not None:
            yield from leaves(section, f"{prefix}{name}.")
        else:
            yield prefix + name, info


# -------------------------------------------------------------------------- sections


class ConfigSection(BaseModel):
    """A config section: strict types (no 1 for true, no 1.5 or true for an integer, no
    NaN), unknown keys refused, then declared choices and the section's own `_check`.
    Every failure is a one-line `UserError`."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    _prefix: ClassVar[str] = ""  # dotted position in messages, e.g. "optim"
    _root: ClassVar[type[ConfigSection] | None] = None  # set by `config_root`

    def __init__(self, /, **data: Any) -> None:
        # pydantic calls this for nested sections too (a custom __init__), with text keys
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise user_error(exc, type(self), data) from None

    @model_validator(mode="after")
    def _rules(self) -> ConfigSection:
        for name, info in type(self).model_fields.items():
            value, choices = getattr(self, name), field_rules(info).get("choices")
            if value is not None and choices and value not in choices:  # null: off / same as
                key = f"{self._prefix}.{name}" if self._prefix else name
                guess = closest_match(str(value), list(choices))
                first = next(iter(choices))
                hint = f"did you mean {key}={guess}?" if guess else f"e.g. {key}={first}"
                raise UserError(
                    f"{key} must be one of {', '.join(choices)}, got {show(value)}; {hint}"
                )
        self._check()
        return self

    def _check(self) -> None:
        """Checks that involve several fields; sections override this."""

    def validate(self) -> None:  # type: ignore[override]  # (pydantic v1's classmethod)
        """Check again after fields were set by hand; raise UserError on a mistake."""
        validated(type(self), self.model_dump())


_R = TypeVar("_R", bound=type[ConfigSection])
_S = TypeVar("_S", bound=ConfigSection)


def config_root(root: _R) -> _R:
    """Class decorator: `root` is the whole config. Its sections (itself included) learn
    it, so a section's unknown key can be matched against every key of the config."""
    stack: list[type[ConfigSection]] = [root]
    while stack:
        cls = stack.pop()
        cls._root = root
        stack += [s for name in cls.model_fields if (s := section_type(cls, name)) is not None]
    return root


# ----------------------------------------------------------- pydantic errors, one line


def validated(cls: type[_S], data: Any) -> _S:
    """`cls` built and checked from `data` (copied, so the config shares nothing with it)."""
    try:
        return cls.model_validate(_text_keys(cls, copy.deepcopy(data)))
    except ValidationError as exc:
        raise user_error(exc, cls, data) from None


def _text_keys(cls: type[BaseModel], data: Any) -> Any:
    """`data` with the keys of every section as text: YAML allows `1:`, but pydantic hands a
    section's keys to `__init__` as keyword arguments. Such a key is then an unknown key."""
    if not isinstance(data, Mapping):
        return data
    out = {}
    for key, value in data.items():
        section = section_type(cls, str(key)) if str(key) in cls.model_fields else None
        out[str(key)] = value if section is None else _text_keys(section, value)
    return out


def user_error(exc: ValidationError, cls: type[ConfigSection], data: Any) -> UserError:
    """pydantic's first complaint as one line that names the dotted key and a fix."""
    error = exc.errors(include_url=False)[0]
    raised = error.get("ctx", {}).get("error")
    if isinstance(raised, UserError):
        return raised  # a choice or a `_check`: worded for the user already
    owner, prefix, loc, value = cls, f"{cls._prefix}." if cls._prefix else "", error["loc"], data
    if not loc:  # the whole config is not a mapping
        return _not_a_mapping(cls, prefix, data)
    for depth, name in enumerate(loc):  # down the sections to the key at fault
        if name not in owner.model_fields:
            return unknown_key(owner, prefix, name)
        value = value.get(name) if isinstance(value, Mapping) else None
        section = section_type(owner, name)
        if section is None:
            break  # a plain key (further loc parts point inside its value)
        if depth == len(loc) - 1:
            return _not_a_mapping(section, f"{prefix}{name}.", value)
        owner, prefix = section, f"{prefix}{name}."
    key, info = prefix + name, owner.model_fields[name]
    example, rules = _example(info), field_rules(info)
    if error["type"] in _BOUND_ERRORS:
        why = f" ({rules['why']})" if "why" in rules else ""
        return UserError(
            f"{key} must be {bounds_text(rules)}, got {show(value)}{why}; "
            f"e.g. {key}={yaml_text(example)}"
        )
    fix = "" if example is None else f"; e.g. {key}={yaml_text(example)}"
    return UserError(
        f"config key '{key}' expects {_describe(info.annotation)}, got {show(value)}{fix}"
    )


def _not_a_mapping(cls: type[ConfigSection], prefix: str, value: Any) -> UserError:
    what = f"config section '{prefix[:-1]}'" if prefix else "a config"
    first = next(n for n in cls.model_fields if section_type(cls, n) is None)
    return UserError(
        f"{what} must be a mapping of keys (such as {prefix}{first}), got {show(value)}"
    )


def unknown_key(cls: type[ConfigSection], prefix: str, name: Any) -> UserError:
    """'unknown config key' with the most likely meant key: the same name in another
    section, else the closest name in this section, else the closest dotted key."""
    name, keys = str(name), [key for key, _ in leaves(cls._root or cls)]
    guess = next((k for k in keys if k.rsplit(".", 1)[-1] == name), None)
    if guess is None:
        local = closest_match(name, list(cls.model_fields))
        guess = prefix + local if local else closest_match(prefix + name, keys)
    hint = f"did you mean '{guess}'?" if guess else "`starpo train --help` lists every key"
    return UserError(f"unknown config key '{prefix}{name}'; {hint}")


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _describe(next(a for a in args if a is not type(None))) + " or null"
    if origin is dict:
        return "a mapping such as {size: 6}"
    if origin is tuple:
        return f"a list of {len(args)} numbers"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, "a section")


# ----------------------------------------------------------------------------- YAML


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e-6` as a number (as YAML 1.2 does; 1.1: text)."""


class YamlDumper(yaml.SafeDumper):
    """Quotes text that `YamlLoader` would read as a number, so saved configs round-trip."""


_FLOAT_12 = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
for _yaml_cls in (YamlLoader, YamlDumper):
    _yaml_cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


def yaml_text(value: Any) -> str:
    """One line of YAML, as a user would type it after `key=`."""
    text = yaml.dump(plain(value), Dumper=YamlDumper, default_flow_style=True, width=10**6)
    return text.strip().removesuffix("\n...")


def show(value: Any, limit: int = 60) -> str:
    """A value as a message quotes it: one line of YAML, cut at `limit` characters."""
    try:
        text = " ".join(yaml_text(value).split())  # one line, whatever the value
    except yaml.YAMLError:
        text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain(value: Any) -> Any:
    """Sections to dicts and tuples to lists: what YAML writes."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
