"""The per-episode settings (`RolloutSettings`): turn and action limits, sampling, the
prompt's format choices and the env's time limit, each with its help, bounds and default,
defined once. The training config's `rollout` section, `starpo eval`'s flags and
`starpo sft`'s layout flags are all built from this definition, and `check_settings`
gives the one-line error that names the config key or flag. Stdlib only: the config layer
sits below the rollout engine that plays episodes with these settings."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from starpo.errors import UserError


def _setting(default: Any, help: str, **bounds: float) -> Any:
    """A per-episode setting: its default, help text and bounds (gt/ge/le), kept as field
    metadata in the shape of the training config's fields, so the config section and the
    `starpo eval` flags are built from these and check the same bounds."""
    return field(default=default, metadata={"help": help, **bounds})


@dataclass(frozen=True)
class RolloutSettings:
    """Limits and sampling of one episode: the one definition of these settings, with their
    help, bounds and defaults (defaults: RAGEN, arXiv 2504.20073, and its config).

    The trainer builds it from the config's `rollout` section, `starpo eval` from its flags
    (see `check_settings` for the one-line error naming the flag or config key).
    """

    max_turns: int = _setting(5, "Turns per episode at most.", ge=1)
    max_actions_per_turn: int = _setting(5, "Actions one answer may hold (separated by ||).", ge=1)
    max_actions_per_traj: int = _setting(
        10, "Valid actions per episode at most (invalid ones use none).", ge=1
    )
    max_new_tokens: int = _setting(400, "Token budget of one turn's response.", ge=1)
    max_response_words: int = _setting(100, "Response length the prompt asks for, in words.", ge=1)
    temperature: float = _setting(1.0, "Sampling temperature; 0 = greedy.", ge=0.0)
    top_p: float = _setting(1.0, "Nucleus sampling mass.", gt=0.0, le=1.0)
    think: bool = _setting(
        True, "Ask for <think>...</think> first; false = prompt ends with <answer>."
    )
    format_penalty: float = _setting(
        -0.1, "Training reward of an unparsable turn or invalid action; 0 = none.", le=0.0
    )
    format_reward: float = _setting(
        0.0,
        "Shaping bonus for a well-formed turn (think/answer structure parsed), whatever its "
        "action; helps small models that never follow the format. 0 = the paper.",
        ge=0.0,
    )
    stop_at_answer: bool = _setting(
        True, "End a turn's generation at </answer> (the rest would be ignored)."
    )
    format_every_turn: bool = _setting(
        True,
        "Repeat the output-format reminder in every turn's message (RAGEN); false = in the "
        "first only, ~29% fewer tokens per Sokoban dialogue to encode and train on.",
    )
    env_timeout_s: float = _setting(
        60.0,
        "Seconds an env's reset or step may take; past it the episode ends as errored "
        "(the env's thread is abandoned) and training goes on. 0 = no limit.",
        ge=0.0,
    )

    def __post_init__(self) -> None:
        check_settings({f.name: getattr(self, f.name) for f in fields(self)})


_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "gt": (operator.gt, ">"),
    "ge": (operator.ge, ">="),
    "le": (operator.le, "<="),
}


def check_settings(values: Mapping[str, Any], spell: Callable[[str], str] = str) -> None:
    """Raise a one-line UserError for the first value outside its setting's bounds, naming
    it as `spell(field name)` says (`--max-turns` for a flag, `rollout.max_turns` for the
    config). Missing names are skipped, as are names that are not settings."""
    for f in fields(RolloutSettings):
        value = values.get(f.name)
        bounds = [(ok, sign, f.metadata[r]) for r, (ok, sign) in _BOUNDS.items() if r in f.metadata]
        if value is None or isinstance(value, bool) or all(ok(value, b) for ok, _, b in bounds):
            continue
        need = " and ".join(f"{sign} {b}" for _, sign, b in bounds)
        raise UserError(f"{spell(f.name)} must be {need}, got {value}")
