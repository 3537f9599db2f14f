"""The per-episode settings (`EpisodeSettings`, once `RolloutSettings`): turn and action
limits, sampling, the prompt's format choices and the env's time limit, each declared once
with `config_field` (help, bounds, choices), as every setting of starpo is. The training
config's `rollout` section extends this class, `starpo eval`'s flags and `starpo sft`'s
layout flags are built from its fields, and `check_settings` gives the one-line error that
names the flag. Torch-free: the config layer sits below the rollout engine that plays
episodes with these settings."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ConfigDict

from starpo.config.fields import ConfigSection, config_field, field_rules
from starpo.errors import UserError

#: The per-episode settings that shape a replayed (SFT) example; the others, sampling and
#: reward shaping, play no part in a replay.
LAYOUT_SETTINGS = (
    "max_turns",
    "max_actions_per_turn",
    "max_actions_per_traj",
    "max_new_tokens",
    "max_response_words",
    "think",
    "stop_at_answer",
    "format_every_turn",
    "context_window",
    "context_turns",
    "tool_format",
)
#: Layout settings added after recipes began recording layouts (`EpisodeSettings.layout`):
#: recorded only off their default, so a recipe folder made before them still resumes.
LATER_LAYOUT_SETTINGS = ("tool_format",)


class EpisodeSettings(ConfigSection):
    """Limits and sampling of one episode: the one definition of these settings, with their
    help, bounds and defaults (defaults: RAGEN, arXiv 2504.20073, and its config). Frozen:
    one value is shared by every episode of a stage (and hashable).

    The config's `rollout` section is this plus the settings of a whole rollout stage;
    `starpo eval` builds it from its flags (see `check_settings` for the one-line error
    naming the flag).
    """

    model_config = ConfigDict(frozen=True)

    max_turns: int = config_field(5, "Turns per episode at most.", ge=1)
    max_actions_per_turn: int = config_field(
        5, "Actions one answer may hold (separated by ||).", ge=1
    )
    max_actions_per_traj: int = config_field(
        10, "Valid actions per episode at most (invalid ones use none).", ge=1
    )
    max_new_tokens: int = config_field(400, "Token budget of one turn's response.", ge=1)
    max_response_words: int = config_field(
        100, "Response length the prompt asks for, in words.", ge=1
    )
    temperature: float = config_field(1.0, "Sampling temperature; 0 = greedy.", ge=0.0)
    top_p: float = config_field(1.0, "Nucleus sampling mass.", gt=0.0, le=1.0)
    think: bool = config_field(
        True, "Ask for <think>...</think> first; false = prompt ends with <answer>."
    )
    format_penalty: float = config_field(
        -0.1, "Training reward of an unparsable turn or invalid action; 0 = none.", le=0.0
    )
    format_reward: float = config_field(
        0.0,
        "Shaping bonus for a well-formed turn (think/answer structure parsed), whatever its "
        "action; helps small models that never follow the format. 0 = the paper.",
        ge=0.0,
    )
    stop_at_answer: bool = config_field(
        True,
        "End a turn's generation at </answer> (the rest would be ignored); a tool env's turn "
        "of one call at </tool_call>.",
    )
    format_every_turn: bool = config_field(
        True,
        "Repeat the output-format reminder in every turn's message (RAGEN); false = in the "
        "first only, ~29% fewer tokens per Sokoban dialogue to encode and train on.",
    )
    context_window: str = config_field(
        "full",
        "What each turn's prompt shows (RAGEN-2's context window modes): full = the whole "
        "dialogue; last_k = the task plus the last `context_turns` turns; single_turn = the "
        "task and the current state only. A prompt that drops a turn is encoded afresh and "
        "trained as a sequence of its own.",
        choices=("full", "last_k", "single_turn"),
    )
    context_turns: int = config_field(
        2, "Earlier turns a last_k prompt keeps besides the current one.", ge=1
    )
    tool_format: str = config_field(
        "json",
        "How the system message lists a tool env's tools for a chat template without tool "
        "support (SmolLM2's): json = one JSON schema a line; signatures = one line a tool, "
        "e.g. `get_order(order_id: string) -- An order's status...` (names, types, optional "
        "arguments, enums, bounds, descriptions kept; calls still written as JSON): 46-54% "
        "fewer system-message tokens in invoice and support. Not for a template that lays "
        "out tools itself (Qwen2.5, Llama 3.1) or --policy api: they refuse signatures.",
        choices=("json", "signatures"),
    )
    env_timeout_s: float = config_field(
        60.0,
        "Seconds an env's reset or step may take; past it the episode ends as errored "
        "(the env's thread is abandoned) and training goes on. 0 = no limit.",
        ge=0.0,
    )

    def layout(self) -> dict[str, Any]:
        """The settings that shape a replayed (SFT) example, by name: `LAYOUT_SETTINGS`
        (those of `LATER_LAYOUT_SETTINGS` only where they are off their default)."""
        defaults = {name: type(self).model_fields[name].default for name in LAYOUT_SETTINGS}
        return {
            name: getattr(self, name)
            for name in LAYOUT_SETTINGS
            if name not in LATER_LAYOUT_SETTINGS or getattr(self, name) != defaults[name]
        }

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


def setting_problem(rules: Mapping[str, Any], value: Any) -> str | None:
    """What `value` breaks of a setting's rules (`field_rules`: "must be ..."), or None. A
    number must be finite, as every config value must; a bool is no number to bound."""
    choices = rules.get("choices")
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(choices)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    bounds = [(ok, sign, rules[r]) for r, (ok, sign) in _BOUNDS.items() if r in rules]
    finite = math.isfinite(value)
    if finite and all(ok(value, b) for ok, _, b in bounds):
        return None
    need = " and ".join(f"{sign} {b}" for _, sign, b in bounds)
    return f"must be {need}" if finite else f"must be a finite number {need}".rstrip()


def check_settings(
    values: Mapping[str, Any],
    spell: Callable[[str], str] = str,
    settings: type[ConfigSection] | None = None,
) -> None:
    """Raise a one-line UserError for the first value outside its setting's rules, naming
    it as `spell(field name)` says (`--max-turns` for a flag). `settings`: the section
    whose fields hold the rules (`EpisodeSettings` by default). Missing names are skipped,
    as are names that are not settings. Sections check themselves when built (naming the
    config key); this is for values that arrive under another name, a command's flags."""
    for name, info in (settings or EpisodeSettings).model_fields.items():
        value = values.get(name)
        problem = None if value is None else setting_problem(field_rules(info), value)
        if problem is not None:
            raise UserError(f"{spell(name)} {problem}, got {value}")
