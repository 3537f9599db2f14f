"""Chat-template pieces: incremental token chunks equal tokenising the rendered dialogue."""

from __future__ import annotations

import copy

import pytest

from starpo.errors import UserError
from starpo.models import load_tokenizer
from starpo.rollout.chat import ChatTokens, read_template


def test_template_pieces_of_chatml():
    pieces = read_template(load_tokenizer())
    assert pieces.user_to_assistant == "<|im_end|>\n<|im_start|>assistant\n"
    assert pieces.assistant_end == "<|im_end|>\n"
    assert pieces.assistant_to_user == "<|im_start|>user\n"


@pytest.mark.parametrize("agent_closed_turn", [True, False])
def test_incremental_chunks_equal_full_tokenisation(agent_closed_turn: bool):
    tokenizer = load_tokenizer()
    chat = ChatTokens(tokenizer, "<think>")
    answer = "plan</think><answer>Up</answer>"
    closing = "<|im_end|>" if agent_closed_turn else ""
    ids = chat.first_prompt("SYS", "Turn 1: state")
    ids += tokenizer.encode(answer + closing, add_special_tokens=False)
    ids += chat.next_turn("Reward:\n1\nTurn 2", stop_text=closing)
    messages = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "Turn 1: state"},
        {"role": "assistant", "content": "<think>" + answer},
        {"role": "user", "content": "Reward:\n1\nTurn 2"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ids == tokenizer.encode(text + "<think>", add_special_tokens=False)


def test_tokenizer_without_chat_template_is_a_user_error():
    tokenizer = copy.deepcopy(load_tokenizer())
    tokenizer.chat_template = None
    with pytest.raises(UserError, match="chat template"):
        ChatTokens(tokenizer, "<think>")
