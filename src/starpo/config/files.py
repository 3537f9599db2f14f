"""Config files and the command line: YAML files with `base:` inheritance, presets, dotted
`section.key=value` overrides, and the `--help` listing of every key.

A config is built in layers: the defaults, then a YAML file (a preset from a presets folder,
or any path; a file may inherit from another through a top-level `base: other.yaml`), then
overrides. Written over any root section class (`root`) and presets folder
(`presets_dir`), so it does not import `starpo.config`, which binds them to `TrainConfig`.

Only stdlib, yaml and pydantic here: `starpo train --help` must not pay for importing torch.
"""

from __future__ import annotations

import copy
import difflib
import textwrap
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from starpo.config.fields import (
    ConfigSection,
    YamlDumper,
    YamlLoader,
    bounds_text,
    field_rules,
    leaves,
    plain,
    section_type,
    show,
    unknown_key,
    validated,
    yaml_text,
)
from starpo.errors import UserError, closest_match

_C = TypeVar("_C", bound=ConfigSection)

# ------------------------------------------------------------------ merging, overrides


def merge(cls: type[BaseModel], base: Mapping[str, Any], over: Mapping[str, Any]) -> dict:
    """`over` on top of `base`: sections merge key by key; values (env.kwargs too) replace,
    so a preset that switches env.id does not inherit the old env's arguments."""
    out = dict(base)
    for key, value in over.items():
        section = section_type(cls, key) if key in cls.model_fields else None
        if section and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(section, out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_override(root: type[ConfigSection], data: dict[str, Any], override: str) -> None:
    """Apply one `dotted.key=value` (value parsed as YAML) to a nested config dict."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"override {override!r} must look like KEY=VALUE, e.g. optim.actor_lr=1e-5")
    try:
        value = yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError:
        value = text  # not YAML: keep the text; a non-string field then says what it expects
    _set_dotted(data, root, key.split("."), value, text.strip(), "")


def _set_dotted(
    data: dict, cls: type[ConfigSection], parts: list[str], value: Any, text: str, prefix: str
) -> None:
    name, rest = parts[0], parts[1:]
    key = prefix + name
    if name not in cls.model_fields:
        raise unknown_key(cls, prefix, name)
    section, current = section_type(cls, name), data.get(name)
    tp = cls.model_fields[name].annotation
    if section is not None:
        if rest:
            data[name] = current if isinstance(current, dict) else {}
            _set_dotted(data[name], section, rest, value, text, key + ".")
        elif isinstance(value, Mapping):
            data[name] = merge(section, current if isinstance(current, dict) else {}, value)
        else:
            raise UserError(
                f"config key '{key}' is a section; set one of its keys, "
                f"e.g. {key}.{next(iter(section.model_fields))}=..."
            )
    elif rest:
        sub = f"{{{'.'.join(rest)}: {text}}}" if typing.get_origin(tp) is dict else "VALUE"
        raise UserError(f"config key '{key}' has no sub-keys; write {key}={sub}")
    elif tp in (str, str | None) and isinstance(value, (bool, int, float)):
        data[name] = text  # `trainer.wandb_project=2024` means the text, not the number
    else:
        data[name] = value


# -------------------------------------------------------------- YAML files, presets


def presets(presets_dir: Path) -> list[str]:
    """Names of the presets in `presets_dir` (`starpo train --config NAME`)."""
    return sorted(p.stem for p in presets_dir.glob("*.yaml"))


def resolve_config(presets_dir: Path, name: str | Path) -> Path:
    """The YAML file `--config` names: an existing path, else a preset by name
    (`cpu-tiny-smoke` or `cpu-tiny-smoke.yaml`). A missing path is left for `load_config`
    to report; an unknown bare name is a UserError listing the presets."""
    path = Path(name)
    if path.is_file() or len(path.parts) != 1:
        return path
    preset = presets_dir / (path.name if path.suffix in (".yaml", ".yml") else f"{name}.yaml")
    if preset.is_file() or path.suffix:
        return preset if preset.is_file() else path
    guess = closest_match(path.name, presets(presets_dir))
    hint = f"did you mean '{guess}'? " if guess else ""
    raise UserError(
        f"preset '{name}' not found; {hint}presets: {', '.join(presets(presets_dir))} "
        "(or pass the path of a YAML file)"
    )


def load_config(
    root: type[_C],
    presets_dir: Path,
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> _C:
    """Defaults, then the YAML file at `path` or the preset it names (with its `base:`
    chain), then `overrides`. `preset` becomes the file's stem unless the file sets it (as
    saved configs do)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = resolve_config(presets_dir, path)
        raw = _read_yaml(path)
        data = _with_base(root, presets_dir, raw, path, ())
        if "preset" not in raw:
            data["preset"] = path.stem
    for override in overrides:
        apply_override(root, data, override)
    return validated(root, data)


def save_config(cfg: ConfigSection, path: str | Path) -> None:
    """Write `cfg` as YAML; `load_config(path)` gives back an equal config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.dump(plain(cfg), Dumper=YamlDumper, sort_keys=False, allow_unicode=True)
    path.write_text(
        "# starpo training config (every key; see `starpo train --help`)\n" + body, encoding="utf-8"
    )


def _with_base(
    root: type[ConfigSection],
    presets_dir: Path,
    raw: dict[str, Any],
    path: Path,
    chain: tuple[Path, ...],
) -> dict[str, Any]:
    """`raw` (read from `path`) on top of the file its `base:` names, recursively; `chain`
    holds the files already on the way, to refuse a loop."""
    raw = dict(raw)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise UserError(
            f"config file '{path}': base must name a YAML file, "
            f"e.g. base: paper-base.yaml; got {show(base)}"
        )
    chain = (*chain, path.resolve())
    base_path = path.parent / base
    if not base_path.exists() and (presets_dir / base).is_file():
        base_path = presets_dir / base  # a user's file may build on a shipped preset
    if base_path.resolve() in chain:
        raise UserError(
            f"config file '{path}' inherits from itself through base: {base}; remove the loop"
        )
    parent_raw = _read_yaml(base_path, named_by=path)
    parent = _with_base(root, presets_dir, parent_raw, base_path, chain)
    return merge(root, parent, raw)


def _read_yaml(path: Path, named_by: Path | None = None) -> dict[str, Any]:
    where = f"config file '{path}'" + (f" (base: of '{named_by}')" if named_by else "")
    if not path.exists():
        siblings = [p.name for p in path.parent.glob("*.y*ml")] if path.parent.is_dir() else []
        guess = next(iter(difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.8)), None)
        hint = f"; did you mean '{path.parent / guess}'?" if guess else ""
        raise UserError(f"{where} not found{hint}")
    if path.is_dir() or path.suffix.lower() not in (".yaml", ".yml"):
        raise UserError(
            f"{where} is not a YAML file; pass a .yaml file or a preset name such as "
            "bandit-starpo-s"
        )
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=YamlLoader)
    except UnicodeDecodeError:
        raise UserError(f"{where} is not a text file; pass a .yaml file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise UserError(f"{where} is not valid YAML{line}: {problem}; fix that line") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"{where} must hold a mapping of sections (e.g. 'optim: "
            f"{{actor_lr: 1.0e-6}}'), got {show(data)}"
        )
    return data


# ----------------------------------------------------------------------------- help


def config_help(root: type[ConfigSection]) -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML text, help) for every setting, in declaration order;
    the help ends with the choices and bounds it does not already state."""
    rows = []
    for key, info in leaves(root):
        rules = field_rules(info)
        text, choices = rules["help"], rules.get("choices")
        if choices and not all(c in text for c in choices):
            text += f" One of: {', '.join(choices)}."
        need = bounds_text(rules)
        text += f" Must be {need}." if need else ""
        rows.append((key, yaml_text(info.get_default(call_default_factory=True)), text))
    return rows


def format_config_help(root: type[ConfigSection], width: int = 88) -> str:
    """Every key with its default and help, grouped by section (for an argparse epilog;
    use RawDescriptionHelpFormatter so argparse keeps the layout)."""
    section_help = {name: info.description for name, info in root.model_fields.items()}
    lines = ["config keys (set them in the YAML file or as KEY=VALUE, e.g. optim.actor_lr=1e-5):"]
    current = None
    for key, default, help_text in config_help(root):
        section = key.split(".")[0] if "." in key else ""
        if section != current and section:
            lines.append(f"\n{section}: {section_help[section]}")
        current = section
        lines.append(f"  {key} = {default}")
        lines.append(
            textwrap.fill(help_text, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )
    return "\n".join(lines)
