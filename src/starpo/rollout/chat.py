"""Token chunks of a chat dialogue, built turn by turn without re-tokenising the past.

The chat template is rendered once with placeholder contents to learn its pieces (what opens
a user turn, what closes an assistant turn). Afterwards each turn tokenises only the new text:
the end of the agent's turn, the next user message and the generation prompt. The sequence a
trainer sees is therefore exactly the generated tokens plus these fed-in chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starpo.errors import UserError
from starpo.rollout.parser import BARE_JSON, TAGGED

_S, _U, _A, _N = "SYSTEMMARK", "USERMARK", "ASSISTANTMARK", "NEXTUSERMARK"
_T1, _T2 = "TOOLRESULTONE", "TOOLRESULTTWO"


@dataclass(frozen=True)
class TemplatePieces:
    """Text between message contents, read off a chat template (ChatML values as examples)."""

    before_system: str  # "<|im_start|>system\n"
    system_to_user: str  # "<|im_end|>\n<|im_start|>user\n"
    user_to_assistant: str  # "<|im_end|>\n<|im_start|>assistant\n" (the generation prompt)
    assistant_end: str  # "<|im_end|>\n"
    assistant_to_user: str  # "<|im_start|>user\n"


def _render(
    tokenizer: Any,
    contents: list[tuple[str, str]],
    generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    messages = [{"role": role, "content": content} for role, content in contents]
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **extra
    )


def read_template(tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> TemplatePieces:
    """Split the tokenizer's chat template into the pieces between message contents (with
    `tools`: as the template lays out a dialogue that declares them)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template; use a chat (instruct) model")
    opening = [("system", _S), ("user", _U)]
    prompt = _render(tokenizer, opening, True, tools)
    with_answer = _render(tokenizer, [*opening, ("assistant", _A)], False, tools)
    next_prompt = _render(tokenizer, [*opening, ("assistant", _A), ("user", _N)], True, tools)
    try:
        before_system, rest = prompt.split(_S)
        system_to_user, user_to_assistant = rest.split(_U)
        _, assistant_end = with_answer.split(_A)
        assistant_to_user, after_next = next_prompt[len(with_answer) :].split(_N)
    except ValueError as exc:
        raise UserError(
            "the chat template drops or repeats message contents; use a standard chat template"
        ) from exc
    if not next_prompt.startswith(with_answer) or after_next != user_to_assistant:
        raise UserError(
            "the chat template re-renders earlier turns as the dialogue grows, so turns cannot "
            "be appended token by token; use a model with a ChatML-style template"
        )
    return TemplatePieces(
        before_system, system_to_user, user_to_assistant, assistant_end, assistant_to_user
    )


@dataclass(frozen=True)
class ToolPieces:
    """Text around tool results after an agent turn (ChatML: "<|im_start|>tool\n",
    "<|im_end|>\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n"). `native`:
    the template lays out the tools itself (`apply_chat_template(tools=...)`, e.g. Qwen2.5);
    otherwise the system message must describe them (`prompts.tools_block`)."""

    assistant_to_tool: str
    tool_to_tool: str
    tool_to_assistant: str
    native: bool
    syntax: str = TAGGED  # how the agent writes its calls (`call_syntax`)


#: Tool results sent as a user message, for a template that renders no `tool` role.
_USER_RESULTS = ("<tool_response>\n", "\n</tool_response>\n<tool_response>\n", "\n</tool_response>")


def _tool_split(tokenizer: Any, tools: list[dict[str, Any]] | None) -> tuple[str, ...] | None:
    """(assistant_to_tool, tool_to_tool, tool_to_assistant) as the template renders one and
    two `tool` messages after an agent turn; None when it renders them otherwise (drops,
    refuses or reorders them)."""
    opening = [("system", _S), ("user", _U), ("assistant", _A)]
    try:
        with_answer = _render(tokenizer, opening, False, tools)
        two = _render(tokenizer, [*opening, ("tool", _T1), ("tool", _T2)], True, tools)
        one = _render(tokenizer, [*opening, ("tool", _T1)], True, tools)
        to_tool, rest = two[len(with_answer) :].split(_T1)
        between, to_assistant = rest.split(_T2)
    except Exception:  # noqa: BLE001 - a template may raise on a role it does not know
        return None
    consistent = two.startswith(with_answer) and one == with_answer + to_tool + _T1 + to_assistant
    return (to_tool, between, to_assistant) if consistent else None


_PROBE = "starpo_probe_tool"


def call_syntax(tokenizer: Any, tools: list[dict[str, Any]]) -> str:
    """The call syntax (`starpo.rollout.parser`) of a template that lays out tools itself,
    read off its rendering of an assistant message with a call: a bare JSON object with
    "parameters" (Llama 3.1's templates) is BARE_JSON; `<tool_call>` blocks (Hermes,
    Qwen2.5), or a template that cannot render a call, TAGGED."""
    call = {"type": "function", "function": {"name": _PROBE, "arguments": {"probe": 1}}}
    messages = [
        {"role": "system", "content": _S},
        {"role": "user", "content": _U},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    except Exception:  # noqa: BLE001 - a template may refuse calls in its own way
        return TAGGED
    rendered = text[text.find(_PROBE) :] if _PROBE in text else ""
    if "<tool_call>" in text or '"parameters"' not in rendered:
        return TAGGED
    return BARE_JSON


def read_tool_pieces(tokenizer: Any, tools: list[dict[str, Any]]) -> ToolPieces:
    """How tool results follow an agent turn in this tokenizer's template. A template that
    uses `tools` lays them out natively; one that renders no `tool` role gets the results
    as a user message of `<tool_response>` blocks."""
    native = _render(tokenizer, [("system", _S), ("user", _U)], True, tools) != _render(
        tokenizer, [("system", _S), ("user", _U)], True
    )
    split = _tool_split(tokenizer, tools if native else None)
    if split is None:
        pieces = read_template(tokenizer, tools if native else None)
        opening, between, closing = _USER_RESULTS
        split = (
            pieces.assistant_to_user + opening,
            between,
            closing + pieces.user_to_assistant,
        )
    return ToolPieces(
        *split, native=native, syntax=call_syntax(tokenizer, tools) if native else TAGGED
    )


class ChatTokens:
    """The token chunks fed to the policy at each turn."""

    def __init__(
        self, tokenizer: Any, generation_prefix: str, tools: list[dict[str, Any]] | None = None
    ) -> None:
        """`tools`: the OpenAI function schemas of a tool-calling env (results then follow
        an agent turn as `tool` messages: `tool_results`)."""
        self.tokenizer = tokenizer
        self.tools = read_tool_pieces(tokenizer, tools) if tools else None
        self.pieces = read_template(tokenizer, tools if self.native_tools else None)
        self.generation_prefix = generation_prefix

    @property
    def call_syntax(self) -> str:
        """How the agent writes its tool calls (TAGGED for a template without tools)."""
        return self.tools.syntax if self.tools is not None else TAGGED

    @property
    def native_tools(self) -> bool:
        """Whether the template lays out the tools itself (else the system message must)."""
        return self.tools is not None and self.tools.native

    def encode(self, text: str) -> list[int]:
        """Tokenise text that may contain the template's special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def first_prompt(self, system: str, user: str) -> list[int]:
        """The opening prompt, ending with the generation prefix (e.g. `<think>`)."""
        p = self.pieces
        return self.encode(
            f"{p.before_system}{system}{p.system_to_user}{user}"
            f"{p.user_to_assistant}{self.generation_prefix}"
        )

    def next_turn(self, user: str, stop_text: str = "") -> list[int]:
        """The chunk after an agent turn: the turn's end, the next user message, the prompt.

        `stop_text` is the text of the stop token the agent generated (e.g. `<|im_end|>`), if
        any: that part of the turn's end is already in the sequence.
        """
        p = self.pieces
        end = p.assistant_end
        if stop_text and end.startswith(stop_text):
            end = end[len(stop_text) :]
        return self.encode(
            f"{end}{p.assistant_to_user}{user}{p.user_to_assistant}{self.generation_prefix}"
        )

    def tool_results(self, results: list[str], stop_text: str = "") -> list[int]:
        """The chunk after a tool-calling turn: the turn's end, one `tool` message per
        result, the generation prompt (`stop_text` as in `next_turn`)."""
        if self.tools is None:
            raise ValueError("tool_results needs ChatTokens(..., tools=...)")
        t, end = self.tools, self.pieces.assistant_end
        if stop_text and end.startswith(stop_text):
            end = end[len(stop_text) :]
        body = t.tool_to_tool.join(results)
        return self.encode(
            f"{end}{t.assistant_to_tool}{body}{t.tool_to_assistant}{self.generation_prefix}"
        )
