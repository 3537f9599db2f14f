"""Pieces the benchmarks share: the bandit prompt as the rollout engine builds it, and
this machine's memory bandwidth and fp32 matmul peak, measured in the same run."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

MAX_RESPONSE_WORDS = 100  # the length the prompt asks for (starpo's default)


def bandit_prompt_ids(tokenizer: Any, seed: int, *, think: bool = True) -> list[int]:
    """The prompt starpo's rollout engine feeds for the bandit's first (and only) turn,
    built with the same functions the engine uses."""
    from starpo.envs import make
    from starpo.rollout import prompts
    from starpo.rollout.chat import ChatTokens

    env = make("bandit")
    state, _ = env.reset(seed=seed)
    user = prompts.first_user_message(
        env,
        state,
        max_actions_per_turn=1,
        actions_left=1,
        think=think,
        max_response_words=MAX_RESPONSE_WORDS,
    )
    chat = ChatTokens(tokenizer, prompts.generation_prefix(think))
    return chat.first_prompt(prompts.SYSTEM_PROMPT, user)


def seconds(call: Callable[[], object]) -> float:
    """Wall time of one call."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def memory_bandwidth_gbs(gib: float = 1.0, repeats: int = 5) -> float:
    """Read bandwidth (GB/s): best of `repeats` sums over a filled `gib` GiB fp32 tensor
    (filled, so its pages are real memory, not the kernel's shared zero page)."""
    data = torch.ones(int(gib * 2**30) // 4)
    best = min(seconds(data.sum) for _ in range(repeats))
    return data.numel() * 4 / best / 1e9
