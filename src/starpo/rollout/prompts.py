"""Prompt text, as in RAGEN's public code (arXiv 2504.20073): pure functions of env and settings.

system: "You're a helpful assistant."
user (turn 1): instruction, symbol legend, action list, then the turn block.
user (turn i > 1): "Reward:\\n<r>" then the turn block.
turn block: "Turn i:\\nState:\\n<grid>\\nYou have K actions left. Always output: ..."

The two numbers are the limits the rollout engine enforces:
- "You can make up to N actions" is per turn: N = max_actions_per_turn, the most actions the
  parser reads from one answer (the rest are dropped). RAGEN's code fills N with
  max_actions_per_traj instead (10 in its Sokoban prompt, while its parser keeps 5), which
  promises actions it never runs; we keep its wording but state the per-turn cap.
- "You have K actions left" is per trajectory: K = min(max_actions_per_traj - valid actions
  executed so far, env.steps_left). Invalid actions use no budget, as in RAGEN.
"""

from __future__ import annotations

import json
from typing import Any

from starpo.envs import TextEnv
from starpo.errors import UserError
from starpo.rollout.parser import BARE_JSON, TAGGED
from starpo.rollout.signatures import tool_signature

SYSTEM_PROMPT = "You're a helpful assistant."


def format_instruction(*, think: bool, max_response_words: int) -> str:
    """The output-format reminder that ends every turn block."""
    shape = (
        "<think> [Your thoughts] </think> <answer> [your answer] </answer>"
        if think
        else ("<answer> [your answer] </answer>")
    )
    return (
        f"Always output: {shape} with no extra text. Strictly follow this format. "
        f"Max response length: {max_response_words} words (tokens)."
    )


def task_description(env: TextEnv, *, max_actions_per_turn: int) -> str:
    """Instruction, legend and actions: the part of the first user message that never changes.

    `max_actions_per_turn` is the per-turn cap (see the module docstring), not the episode's.
    """
    lines = [env.instruction]
    if env.legend:
        lines.append(f"The meaning of each symbol in the state is: {env.legend_text()}")
    choices = (
        f"Answer with {env.answer_format}."
        if not env.action_names  # a free-text env (TextEnv.free_text)
        else f"Your available actions are: {', '.join(env.action_names)}."
    )
    lines.append(f"{choices} You can make up to {max_actions_per_turn} actions, separated by ||.")
    return "\n".join(lines)


def turn_block(
    turn: int,
    state: str,
    *,
    actions_left: int,
    think: bool,
    max_response_words: int,
    remind: bool = True,
) -> str:
    """One turn's state and (`remind`) the format reminder; `actions_left`: the episode's
    remaining budget of valid actions."""
    block = f"Turn {turn}:\nState:\n{state}\nYou have {actions_left} actions left."
    if not remind:
        return block
    return f"{block} " + format_instruction(think=think, max_response_words=max_response_words)


def first_user_message(
    env: TextEnv,
    state: str,
    *,
    max_actions_per_turn: int,
    actions_left: int,
    think: bool,
    max_response_words: int,
    turn: int = 1,
) -> str:
    """The opening user message: the task, then turn 1 (or, for a prompt that starts later
    in the dialogue (`EpisodeSettings.context_window`), the turn it starts at)."""
    task = task_description(env, max_actions_per_turn=max_actions_per_turn)
    block = turn_block(
        turn, state, actions_left=actions_left, think=think, max_response_words=max_response_words
    )
    return f"{task}\n{block}"


def next_user_message(
    turn: int,
    reward: float,
    state: str,
    *,
    actions_left: int,
    think: bool,
    max_response_words: int,
    remind: bool = True,
) -> str:
    """The user message after an agent turn: its reward, then the next turn (with the
    format reminder unless `remind` is false: see EpisodeSettings.format_every_turn)."""
    block = turn_block(
        turn,
        state,
        actions_left=actions_left,
        think=think,
        max_response_words=max_response_words,
        remind=remind,
    )
    return f"Reward:\n{reward:g}\n{block}"


def generation_prefix(think: bool) -> str:
    """Text the prompt ends with, so the agent starts inside the right block."""
    return "<think>" if think else "<answer>"


# ------------------------------------------------------------------ tool-calling envs
#: How the agent writes one call (the documented rendering, and Qwen2.5's own).
TOOL_CALL_SHAPE = '<tool_call>{"name": [tool name], "arguments": {[arguments]}}</tool_call>'
#: ... in each call syntax (`starpo.rollout.parser`; Llama 3.1's templates: bare JSON).
CALL_SHAPES = {
    TAGGED: TOOL_CALL_SHAPE,
    BARE_JSON: '{"name": [tool name], "parameters": {[arguments]}}',
}


def _json_listing(schemas: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(what the listing is, one JSON schema a line, how to write the arguments)."""
    lines = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return "Their signatures are JSON schemas", lines, ""


def _signature_listing(schemas: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(what the listing is, one signature a line, how to write the arguments): the lines
    are no JSON, so the block says the call's arguments still are."""
    lines = "\n".join(tool_signature(schema) for schema in schemas)
    return "Their signatures (name?: an optional argument) are", lines, " with JSON arguments"


#: How the system message lists the tools, by `EpisodeSettings.tool_format`.
TOOL_LISTINGS = {"json": _json_listing, "signatures": _signature_listing}


def tools_block(schemas: list[dict[str, Any]], tool_format: str = "json") -> str:
    """The tools, described in the system message for a chat template that does not lay
    them out itself (`ChatTokens.tools.native` false, e.g. SmolLM2's): one a line, as a
    JSON schema or a signature (`tool_format`, see `starpo.rollout.signatures`), and how
    to call them (the same call shape either way)."""
    what, lines, arguments = TOOL_LISTINGS[tool_format](schemas)
    return (
        f"You can call tools. {what} within <tools></tools>:\n"
        f"<tools>\n{lines}\n</tools>\nCall a tool by writing {TOOL_CALL_SHAPE}{arguments}; "
        "each result comes back in the next message."
    )


def tool_system_prompt(
    schemas: list[dict[str, Any]], *, native: bool, tool_format: str = "json"
) -> str:
    """The system message of a tool-calling episode (a native template adds the tools
    itself, and `tool_format` plays no part: `check_tool_format`)."""
    return SYSTEM_PROMPT if native else f"{SYSTEM_PROMPT}\n{tools_block(schemas, tool_format)}"


def check_tool_format(tool_format: str, *, native: bool, lays_out: str) -> None:
    """A one-line UserError for a compact tool listing asked of a policy whose tools are
    laid out by someone else (`lays_out`: "this model's chat template", "the API"): the
    setting would silently change nothing."""
    if native and tool_format != "json":
        raise UserError(
            f"tool_format={tool_format} rewrites the tools in the system message, but "
            f"{lays_out} lays them out itself; use rollout.tool_format=json (starpo eval and "
            "starpo sft: --tool-format json)"
        )


def tool_format_instruction(
    *, think: bool, max_response_words: int, max_calls: int, syntax: str = TAGGED
) -> str:
    """The output-format reminder of a tool-calling turn, calls in `syntax`."""
    call = CALL_SHAPES[syntax]
    shape = f"<think> [Your thoughts] </think> {call}" if think else call
    calls = max_calls if syntax == TAGGED else 1  # bare JSON holds one call
    return (
        f"Always output: {shape} with no extra text, up to {calls} tool "
        f"call{'s' * (calls != 1)} a turn. Max response length: {max_response_words} words "
        "(tokens)."
    )


def tool_task_message(
    env: TextEnv,
    case: str,
    *,
    max_calls: int,
    calls_left: int,
    think: bool,
    max_response_words: int,
    syntax: str = TAGGED,
) -> str:
    """The opening user message of a tool-calling episode: the task, the case (the env's
    observation), the budget and the format (calls in `syntax`)."""
    reminder = tool_format_instruction(
        think=think, max_response_words=max_response_words, max_calls=max_calls, syntax=syntax
    )
    return f"{env.instruction}\n{case}\nYou have {calls_left} tool calls left. {reminder}"


def no_call_message(
    *, think: bool, max_response_words: int, max_calls: int, calls_left: int, syntax: str = TAGGED
) -> str:
    """The user message after a turn that made no well-formed tool call."""
    reminder = tool_format_instruction(
        think=think, max_response_words=max_response_words, max_calls=max_calls, syntax=syntax
    )
    return f"Your reply made no tool call. You have {calls_left} tool calls left. {reminder}"


def tool_generation_prefix(think: bool) -> str:
    """Text a tool-calling turn's prompt ends with: inside the think block, or nothing (the
    agent opens its first call itself, as it may make several)."""
    return "<think>" if think else ""
