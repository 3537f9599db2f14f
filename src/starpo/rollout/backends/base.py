"""The generation interface: token ids in, token ids and log-probs out.

The rollout engine talks only to this interface, so a vLLM or remote backend can replace the
Hugging Face one without touching rollout logic. A backend keeps per-episode state between
calls ("sessions": the KV cache), so each turn only sends the new observation tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from starpo.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn's response."""

    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # e.g. <|im_end|>; the stop token is kept
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # e.g. the tokens of "</answer>"


def ends_with_stop(
    tokens: Sequence[int], params: SamplingParams, end: int | None = None
) -> list[int] | None:
    """The stop that `tokens[:end]` (all of `tokens` by default) ends with, or None.

    The one stop rule: a backend checks it after each sampled token and stops at the
    first hit, keeping the stop. The last token in `stop_token_ids` is the stop, else the
    first of `stop_sequences` the tokens end with (an empty sequence never matches).
    `end` spares callers that scan a long list (`first_stop`) a copy per position.
    """
    end = len(tokens) if end is None else end
    if end and tokens[end - 1] in params.stop_token_ids:
        return [tokens[end - 1]]
    for sequence in params.stop_sequences:
        if (
            sequence
            and end >= len(sequence)
            and tuple(tokens[end - len(sequence) : end]) == tuple(sequence)
        ):
            return list(sequence)
    return None


def first_stop(tokens: Sequence[int], params: SamplingParams) -> tuple[int, list[int]] | None:
    """(length up to and including the first stop, its stop ids) of `tokens`, where a
    backend sampling them in order would stop (`ends_with_stop`); None if it would not."""
    for end in range(1, len(tokens) + 1):
        stop = ends_with_stop(tokens, params, end)
        if stop is not None:
            return end, stop
    return None


@dataclass
class GenerationRequest:
    """Append `new_token_ids` to session `session`'s sequence, then generate."""

    session: int
    new_token_ids: list[int]


@dataclass
class Generation:
    """One session's response to one request."""

    token_ids: list[int]
    logprobs: list[float]  # log-prob of each generated token under the sampling distribution
    finish_reason: Literal["stop", "length"]
    stop_ids: list[int] = field(default_factory=list)  # the stop token/sequence that ended it


@dataclass(frozen=True)
class BackendNumerics:
    """How a backend computes, so the trainer can tell whether its log-probs can serve as
    the PPO ratio's old log-probs (`exact_logprobs`) or must be recomputed."""

    name: str  # e.g. "hf"
    compute_dtype: str  # e.g. "float32", "bfloat16"
    exact_logprobs: bool  # equal to the training forward's within fp32 tolerance
    matmul_kernel: str = "torch"  # what runs its weight matmuls (see rollout.linear_kernels)
    cache_dtype: str | None = None  # its KV cache's, where it is its own (rollout.kv_dtype)

    def describe(self, threads: int) -> str:
        """E.g. "lean backend in bfloat16 (bfloat16 KV cache, torch matmuls, 2 threads)"."""
        cache = f"{self.cache_dtype} KV cache, " if self.cache_dtype else ""
        kernel = f"{cache}{self.matmul_kernel} matmuls, {threads} threads"
        return f"{self.name} backend in {self.compute_dtype} ({kernel})"


class PolicySampler(Protocol):
    """What the trainer needs from whatever samples its policy (a backend in-process, or
    `starpo.distributed.RolloutPool` over Ray workers): how it computes, reseeding, and
    new weights after every update."""

    numerics: BackendNumerics

    def seed(self, seed: int) -> None:
        """Reseed sampling, so a given seed gives the same samples (resume is exact)."""
        ...

    def update_weights(self, model: Any, version: int) -> None:
        """The policy changed (optimizer update number `version`): sample from `model`'s
        weights from now on. Called after every update; may be a no-op for a backend that
        runs the training model itself."""
        ...


class GenerationBackend(PolicySampler, Protocol):
    """A `PolicySampler` the rollout engine generates with (generate, release, reset). A
    backend that holds its own copy of the weights (vLLM, a remote server, a Ray worker)
    receives them in `update_weights`.
    """

    def generate(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        """Generate for every request in one batch; results in request order.

        A session seen for the first time starts an empty sequence. All new sessions must be
        started in the same call (a batch of episodes starts together).
        """
        ...

    def release(self, sessions: Iterable[int]) -> None:
        """Forget finished sessions (free their caches)."""
        ...

    def reset(self) -> None:
        """Forget all sessions."""
        ...


def set_kv_dtype(backend: Any, dtype: Any) -> None:
    """Apply `rollout.kv_dtype` (a torch dtype) to a backend: the lean one holds its cache
    in it; any other may only keep fp32 (its cache follows its own compute dtype)."""
    import torch

    if hasattr(backend, "kv_dtype"):
        backend.kv_dtype = dtype
    elif dtype != torch.float32:
        raise UserError(
            f"rollout.kv_dtype={str(dtype).removeprefix('torch.')}: the "
            f"{type(backend).__name__} backend keeps its cache in rollout.dtype; set "
            "rollout.kv_dtype=fp32, or rollout.backend=lean"
        )


def set_share_histories(backend: Any, on: bool) -> None:
    """Apply `rollout.share_histories` to a backend: the built-in ones have the switch; a
    registered backend without it may only leave it off."""
    if hasattr(backend, "share_histories"):
        backend.share_histories = on
    elif on:
        raise UserError(
            f"rollout.share_histories=true: the {type(backend).__name__} backend cannot share "
            "cache rows; set rollout.share_histories=false"
        )
