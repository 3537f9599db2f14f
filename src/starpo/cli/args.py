"""Command-line pieces every `starpo` command shares: how a setting's name is spelled as a
flag, `--env-arg KEY=VALUE` parsing, the bounds of seeds and episode counts, and the
argparse kind of a per-episode setting's flag. Torch-free: `--help` stays fast."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping
from typing import Any

from starpo.errors import UserError

#: The most episodes one command plays: `starpo eval` keeps them all in memory and writes
#: them, as `starpo sft --from-solver` does.
MAX_EPISODES = 1_000_000


def flag_name(name: str) -> str:
    """A setting's flag: `max_new_tokens` -> `--max-new-tokens`."""
    return "--" + name.replace("_", "-")


def parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """`--env-arg size=6 --env-arg p_frozen=0.9` -> {"size": 6, "p_frozen": 0.9} (YAML values)."""
    import yaml

    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--env-arg {pair!r} must look like KEY=VALUE, e.g. --env-arg size=6")
        try:
            parsed = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise UserError(
                f"--env-arg {pair!r}: {value!r} is not a YAML value ({problem}); quote it or "
                "fix it, e.g. --env-arg dim_room=[6,6]"
            ) from None
        kwargs[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    return kwargs


def check_seed(flag: str, seed: int | None) -> None:
    """A seed flag's value (None: a random seed); numpy takes no negative seed and torch
    none of 2**64 or more."""
    if seed is not None and not 0 <= seed < 2**63:
        raise UserError(f"{flag} must be between 0 and {2**63 - 1}, got {seed}")


def add_setting_flags(
    group: Any,
    section: Any,
    *,
    names: Collection[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    shown: Callable[[str, Any], str] | None = None,
) -> None:
    """One flag per setting of `section` (a config section class: `EpisodeSettings`,
    SFT's `TrainOptions`), its help and choices from the setting's one declaration:
    `--think / --no-think` for a bool, else the default's type. `names`: only these;
    `defaults`: the command's own defaults (None = decided later); `shown(name, default)`:
    how the help text states the default. Values are checked by the section's rules when
    the command builds it (`check_settings`), so a mistake is one line naming the flag."""
    from starpo.config.fields import field_rules

    for name, info in section.model_fields.items():
        if names is not None and name not in names:
            continue
        default = (defaults or {}).get(name, info.default)
        kind: dict[str, Any] = {"type": type(info.default)}
        if isinstance(info.default, bool):
            kind = {"action": argparse.BooleanOptionalAction}
        choices = field_rules(info).get("choices")
        one_of = f"one of {', '.join(choices)}; " if choices else ""
        said = shown(name, default) if shown else f"default {default}"
        help_text = f"{info.description} ({one_of}{said})".replace("%", "%%")
        group.add_argument(flag_name(name), default=default, help=help_text, **kind)


def add_decode_flags(parser: Any) -> None:
    """--device, --backend, --dtype and --kv-dtype: how a command that loads a model
    decodes with it (`starpo eval --policy model`, `starpo serve`), spelled as
    rollout.backend/dtype/kv_dtype."""
    from starpo.registry import GENERATION_BACKENDS

    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--backend",
        default="auto",
        choices=list(GENERATION_BACKENDS),
        help="generation backend, as rollout.backend (default auto: lean on a CPU if it can)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "bf16"],
        help="decode dtype, as rollout.dtype (default auto: bf16 on a CPU with native bf16)",
    )
    parser.add_argument(
        "--kv-dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="the lean backend's KV cache dtype, as rollout.kv_dtype (default fp32; bf16: "
        "decode attention reads half the bytes, inexact)",
    )


def add_env_id_argument(parser: Any) -> None:
    """The positional env id of a command that acts on one env."""
    parser.add_argument("env_id", help="a registered env id (see `starpo envs`)")


def add_env_arg_flag(
    parser: Any, what: str = "env constructor argument KEY=VALUE (repeatable), e.g. size=6"
) -> None:
    """`--env-arg KEY=VALUE`, repeatable: the env's constructor arguments (`parse_env_args`)."""
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help=what)


class ListFlag(argparse.Action):
    """A flag that takes a list, space- or comma-separated (`--methods grpo ppo`,
    `--methods grpo,ppo`). A list flag swallows the words after it, so a dotted override
    written next (`--methods grpo trainer.total_steps=5`) would become a list item: a word
    with `=` goes to `trailing_overrides` instead (`all_overrides` joins them). `kind`
    converts each item (int for seeds); `allowed` lists the valid items, checked here
    because argparse's own `choices` would refuse the override before this action sees it."""

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        kind: Callable[[str], Any] = str,
        allowed: Collection[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("nargs", "+")
        super().__init__(option_strings, dest, **kwargs)
        self.kind = kind
        self.allowed = allowed

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        words = [word for value in values if "=" not in value for word in value.split(",")]
        items = []
        for word in filter(None, words):
            try:
                item = self.kind(word)
            except ValueError:
                parser.error(f"{option}: {word!r} is not a valid {self.kind.__name__}")
            if self.allowed is not None and item not in self.allowed:
                parser.error(
                    f"{option}: unknown {word!r}: choose from {', '.join(map(str, self.allowed))}"
                )
            items.append(item)
        if not items:
            parser.error(f"{option} needs at least one value")
        setattr(namespace, self.dest, items)
        overrides = [value for value in values if "=" in value]
        namespace.trailing_overrides = [*getattr(namespace, "trailing_overrides", []), *overrides]


def all_overrides(args: argparse.Namespace) -> list[str]:
    """The positional dotted overrides, then those a `ListFlag` caught after its list."""
    return [*args.overrides, *getattr(args, "trailing_overrides", [])]
