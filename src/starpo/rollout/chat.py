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

_S, _U, _A, _N = "SYSTEMMARK", "USERMARK", "ASSISTANTMARK", "NEXTUSERMARK"


@dataclass(frozen=True)
class TemplatePieces:
    """Text between message contents, read off a chat template (ChatML values as examples)."""

    before_system: str  # "<|im_start|>system\n"
    system_to_user: str  # "<|im_end|>\n<|im_start|>user\n"
    user_to_assistant: str  # "<|im_end|>\n<|im_start|>assistant\n" (the generation prompt)
    assistant_end: str  # "<|im_end|>\n"
    assistant_to_user: str  # "<|im_start|>user\n"


def _render(tokenizer: Any, contents: list[tuple[str, str]], generation_prompt: bool) -> str:
    messages = [{"role": role, "content": content} for role, content in contents]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def read_template(tokenizer: Any) -> TemplatePieces:
    """Split the tokenizer's chat template into the pieces between message contents."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template; use a chat (instruct) model")
    opening = [("system", _S), ("user", _U)]
    prompt = _render(tokenizer, opening, True)
    with_answer = _render(tokenizer, [*opening, ("assistant", _A)], False)
    next_prompt = _render(tokenizer, [*opening, ("assistant", _A), ("user", _N)], True)
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


class ChatTokens:
    """The token chunks fed to the policy at each turn."""

    def __init__(self, tokenizer: Any, generation_prefix: str) -> None:
        self.tokenizer = tokenizer
        self.pieces = read_template(tokenizer)
        self.generation_prefix = generation_prefix

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
