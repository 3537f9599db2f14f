"""The per-episode settings (`EpisodeSettings`, once `RolloutSettings`): turn and action
limits, sampling, the prompt's format choices and the env's time limit, each with its help,
bounds and default, defined once. The training config's `rollout` section, `starpo eval`'s
flags and `starpo sft`'s layout flags are all built from this definition, and
`check_settings` gives the one-line error that names the config key or flag. Stdlib only:
the config layer sits below the rollout engine that plays episodes with these settings."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from starpo.errors import UserError


def setting(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    finite: bool = False,
    **bounds: float,
) -> Any:
    """A field of a settings dataclass (`EpisodeSettings`, SFT's `TrainOptions`): its
    default, help text, bounds (gt/ge/lt/le), allowed `choices` and whether it must be a
    `finite` number, kept as field metadata in the shape of the training config's fields,
    so config sections and command flags are built from these and `check_settings` checks
    them all one way."""
    rules: dict[str, Any] = dict(bounds)
    if choices is not None:
        rules["choices"] = tuple(choices)
    if finite:
        rules["finite"] = True
    return field(default=default, metadata={"help": help, **rules})


@dataclass(frozen=True)
class EpisodeSettings:
    """Limits and sampling of one episode: the one definition of these settings, with their
    help, bounds and defaults (defaults: RAGEN, arXiv 2504.20073, and its config).

    The trainer builds it from the config's `rollout` section, `starpo eval` from its flags
    (see `check_settings` for the one-line error naming the flag or config key).
    """

    max_turns: int = setting(5, "Turns per episode at most.", ge=1)
    max_actions_per_turn: int = setting(5, "Actions one answer may hold (separated by ||).", ge=1)
    max_actions_per_traj: int = setting(
        10, "Valid actions per episode at most (invalid ones use none).", ge=1
    )
    max_new_tokens: int = setting(400, "Token budget of one turn's response.", ge=1)
    max_response_words: int = setting(100, "Response length the prompt asks for, in words.", ge=1)
    temperature: float = setting(1.0, "Sampling temperature; 0 = greedy.", ge=0.0)
    top_p: float = setting(1.0, "Nucleus sampling mass.", gt=0.0, le=1.0)
    think: bool = setting(
        True, "Ask for <think>...</think> first; false = prompt ends with <answer>."
    )
    format_penalty: float = setting(
        -0.1, "Training reward of an unparsable turn or invalid action; 0 = none.", le=0.0
    )
    format_reward: float = setting(
        0.0,
        "Shaping bonus for a well-formed turn (think/answer structure parsed), whatever its "
        "action; helps small models that never follow the format. 0 = the paper.",
        ge=0.0,
    )
    stop_at_answer: bool = setting(
        True, "End a turn's generation at </answer> (the rest would be ignored)."
    )
    format_every_turn: bool = setting(
        True,
        "Repeat the output-format reminder in every turn's message (RAGEN); false = in the "
        "first only, ~29% fewer tokens per Sokoban dialogue to encode and train on.",
    )
    context_window: str = setting(
        "full",
        "What each turn's prompt shows (RAGEN-2's context window modes): full = the whole "
        "dialogue; last_k = the task plus the last `context_turns` turns; single_turn = the "
        "task and the current state only. A prompt that drops a turn is encoded afresh and "
        "trained as a sequence of its own.",
        choices=("full", "last_k", "single_turn"),
    )
    context_turns: int = setting(
        2, "Earlier turns a last_k prompt keeps besides the current one.", ge=1
    )
    env_timeout_s: float = setting(
        60.0,
        "Seconds an env's reset or step may take; past it the episode ends as errored "
        "(the env's thread is abandoned) and training goes on. 0 = no limit.",
        ge=0.0,
    )

    def __post_init__(self) -> None:
        check_settings({f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def turns_kept(self) -> int | None:
        """Earlier turns a prompt shows besides the current one; None = all of them."""
        if self.context_window == "full":
            return None
        return 0 if self.context_window == "single_turn" else self.context_turns

    def window_start(self, turn: int) -> int:
        """The first turn (1-based) whose state the prompt of `turn` shows."""
        kept = self.turns_kept
        return 1 if kept is None else max(1, turn - kept)

    def rebuilds(self, turn: int) -> bool:
        """Whether the prompt of `turn` is built afresh (`prompt_rebuilt`)."""
        return prompt_rebuilt(self.turns_kept, turn)


#: The name before 2026-12-04 (it read as the config's `rollout` section, `RolloutConfig`,
#: which holds these and the settings of a whole rollout stage); kept for user code.
RolloutSettings = EpisodeSettings


def prompt_rebuilt(turns_kept: int | None, turn: int) -> bool:
    """Whether the prompt of `turn` (1-based) is built afresh, its window having dropped a
    turn: once more than `turns_kept` earlier turns exist (never when None, the whole
    dialogue). The rollout engine and the memory plan both ask this."""
    return turns_kept is not None and turn > turns_kept + 1


_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "gt": (operator.gt, ">"),
    "ge": (operator.ge, ">="),
    "lt": (operator.lt, "<"),
    "le": (operator.le, "<="),
}


def setting_problem(metadata: Mapping[str, Any], value: Any) -> str | None:
    """What `value` breaks of a setting's rules ("must be ..."), or None. NaN fails every
    bound; a bool is no number to bound."""
    choices = metadata.get("choices")
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(choices)}"
    if isinstance(value, bool):
        return None
    bounds = [(ok, sign, metadata[r]) for r, (ok, sign) in _BOUNDS.items() if r in metadata]
    finite = metadata.get("finite", False)
    if all(ok(value, b) for ok, _, b in bounds) and not (finite and not math.isfinite(value)):
        return None
    need = " and ".join(f"{sign} {b}" for _, sign, b in bounds)
    return f"must be a finite number {need}".rstrip() if finite else f"must be {need}"


def check_settings(
    values: Mapping[str, Any], spell: Callable[[str], str] = str, settings: type | None = None
) -> None:
    """Raise a one-line UserError for the first value outside its setting's rules, naming
    it as `spell(field name)` says (`--max-turns` for a flag, `rollout.max_turns` for the
    config). `settings`: the dataclass whose fields hold the rules (`EpisodeSettings` by
    default). Missing names are skipped, as are names that are not settings."""
    for f in fields(settings or EpisodeSettings):
        value = values.get(f.name)
        problem = None if value is None else setting_problem(f.metadata, value)
        if problem is not None:
            raise UserError(f"{spell(f.name)} {problem}, got {value}")
