"""Parse an agent turn: `<think>...</think><answer>A || B</answer>` -> thought and actions.

The parser never raises. A turn is well formed when the whole text is exactly one think block
(when thinking is on) followed by one answer block holding at least one action; anything else
is malformed, yields no actions, and earns the format penalty in the rollout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_SEPARATOR = "||"
TAGS = ("<think>", "</think>", "<answer>", "</answer>")

_THINK_ANSWER = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.DOTALL)
_ANSWER_ONLY = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.DOTALL)


@dataclass(frozen=True)
class ParsedTurn:
    """What the agent said in one turn."""

    think: str  # the reasoning ("" when absent or malformed)
    actions: tuple[str, ...]  # at most `max_actions`, stripped, in order
    format_ok: bool  # the text had the required structure and at least one action
    num_dropped_actions: int = 0  # actions beyond `max_actions`, ignored


MALFORMED = ParsedTurn(think="", actions=(), format_ok=False)


def split_actions(answer: str) -> list[str]:
    """`"Up || left ||"` -> `["Up", "left"]` (empty pieces dropped)."""
    return [piece.strip() for piece in answer.split(ACTION_SEPARATOR) if piece.strip()]


def parse_turn(text: str, *, think: bool = True, max_actions: int = 5) -> ParsedTurn:
    """Parse one agent turn (the text includes the `<think>` the prompt ended with)."""
    if not isinstance(text, str):
        return MALFORMED
    match = (_THINK_ANSWER if think else _ANSWER_ONLY).fullmatch(text)
    if match is None:
        return MALFORMED
    thought, answer = match.groups() if think else ("", match.group(1))
    # A tag inside a block means the structure was not the one required (e.g. two answers).
    if any(tag in thought or tag in answer for tag in TAGS):
        return MALFORMED
    actions = split_actions(answer)
    if not actions:
        return ParsedTurn(think=thought.strip(), actions=(), format_ok=False)
    kept = tuple(actions[: max(max_actions, 0)])
    return ParsedTurn(
        think=thought.strip(),
        actions=kept,
        format_ok=bool(kept),
        num_dropped_actions=len(actions) - len(kept),
    )


# ------------------------------------------------------------------ tool-calling turns
#: A tool-calling turn: `<think>...</think>` (when thinking is on), then the calls in one of
#: two syntaxes (the model's chat template decides which: `starpo.rollout.chat.call_syntax`):
#: TAGGED, one or more `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
#: (Hermes, Qwen2.5, and the rendering for templates without tools); BARE_JSON, the reply is
#: one JSON object `{"name": ..., "parameters": {...}}` (Llama 3.1's templates: one call a
#: turn). Nothing else.
TAGGED, BARE_JSON = "tagged", "json"
TOOL_TAGS = ("<tool_call>", "</tool_call>")
_TOOL_CALL = re.compile(r"\s*<tool_call>(.*?)</tool_call>\s*", re.DOTALL)
_THINK_REST = re.compile(r"\s*<think>(.*?)</think>(.*)", re.DOTALL)


def parse_tool_turn(
    text: str, *, think: bool = True, max_calls: int = 5, syntax: str = TAGGED
) -> ParsedTurn:
    """Parse a tool-calling turn: its reasoning and the text of each call (judged by the env,
    which reads the JSON: a call that is not valid JSON is an invalid action, not a broken
    format) in `syntax` (TAGGED or BARE_JSON). Never raises; anything but the structure
    above is malformed."""
    if not isinstance(text, str):
        return MALFORMED
    thought, rest = "", text
    if think:
        match = _THINK_REST.fullmatch(text)
        if match is None:
            return MALFORMED
        thought, rest = match.groups()
        if any(tag in thought for tag in (*TAGS, *TOOL_TAGS)):
            return MALFORMED
    if syntax == BARE_JSON:
        return _bare_json_call(thought, rest, max_calls)
    calls, position = [], 0
    while position < len(rest):
        match = _TOOL_CALL.match(rest, position)
        if match is None:
            return MALFORMED  # text outside the call blocks
        body = match.group(1)
        if any(tag in body for tag in (*TAGS, *TOOL_TAGS)):
            return MALFORMED
        calls.append(body.strip())
        position = match.end()
    if not calls:
        return ParsedTurn(think=thought.strip(), actions=(), format_ok=False)
    kept = tuple(calls[: max(max_calls, 0)])
    return ParsedTurn(
        think=thought.strip(),
        actions=kept,
        format_ok=bool(kept),
        num_dropped_actions=len(calls) - len(kept),
    )


def _bare_json_call(thought: str, rest: str, max_calls: int) -> ParsedTurn:
    """A BARE_JSON turn after its think block: the rest is one `{...}` (the env reads it)."""
    body = rest.strip()
    if not body:
        return ParsedTurn(think=thought.strip(), actions=(), format_ok=False)
    if not (body.startswith("{") and body.endswith("}")):
        return MALFORMED  # text around the call
    if any(tag in body for tag in (*TAGS, *TOOL_TAGS)):
        return MALFORMED
    kept = (body,) if max_calls > 0 else ()
    return ParsedTurn(think=thought.strip(), actions=kept, format_ok=bool(kept))
