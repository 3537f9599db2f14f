"""Batched generation with a Hugging Face causal LM, keeping each episode's KV cache.

All sessions of a batch share one cache tensor per layer. Sequences have different lengths, so
chunks are left-padded and padding becomes "holes" in the attention mask (mask 0); position
ids count only real tokens (cumsum of the mask), so a sequence sees exactly the positions it
would see alone. A token sampled at the end of a turn is fed at the start of the next call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from starpo.models.compat import cache_argument
from starpo.models.precision import precision_for
from starpo.rollout.backends.base import (
    BackendNumerics,
    Generation,
    GenerationRequest,
    SamplingParams,
    ends_with_stop,
)


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (tokens, log-probs under the temperature-scaled
    distribution). logits: (B, V). temperature 0 = greedy (log-probs at temperature 1)."""
    logits = logits.float()
    if temperature <= 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]
    # Dividing by 1 would only copy the (B, V) logits (x / 1 == x exactly).
    scaled = logits if temperature == 1.0 else logits / temperature
    logprobs = torch.log_softmax(scaled, dim=-1)  # (B, V)
    del scaled
    probs = logprobs.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest set of tokens whose mass reaches top_p (the first token always).
        # In place where a tensor is this function's own: each is a (B, V) matrix.
        mass_before = sorted_probs.cumsum(dim=-1).sub_(sorted_probs)
        sorted_probs.masked_fill_(mass_before >= top_p, 0.0)
        del mass_before
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    tokens = inverse_cdf_sample(probs, generator)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


def block_sums_fp64(blocks: torch.Tensor, rows_at_once: int = 16) -> torch.Tensor:
    """blocks.sum(-1, dtype=float64) a few rows at a time: the sum converts its whole input
    to fp64 first, two (B, V) fp32 matrices more at once (bitwise the same sums)."""
    return torch.cat(
        [
            blocks[start : start + rows_at_once].sum(dim=-1, dtype=torch.float64)
            for start in range(0, blocks.shape[0], rows_at_once)
        ]
    )


def inverse_cdf_sample(
    probs: torch.Tensor, generator: torch.Generator | None, block: int = 256
) -> torch.Tensor:
    """One draw per row of (B, V) probabilities by inverting the cumulative sum with one
    uniform number, in two levels: pick a block of `block` tokens by the blocks' masses,
    then a token inside it. torch.multinomial draws an exponential per vocabulary entry
    (32 ms of a 150 ms decode step at batch 32 on a CPU) and a full-length cumsum is a
    sequential scan (22 ms at batch 128); block sums and two short cumsums are a few ms.
    Sums are fp64, so rounding cannot move mass between tokens; zero-probability tokens
    (cut by top-p) are never picked, as the cumulative sum does not rise at them."""
    rows, vocab = probs.shape
    padded = F.pad(probs, (0, -vocab % block)) if vocab % block else probs  # pad copies
    blocks = padded.view(rows, -1, block)  # (B, nb, block)
    cdf = block_sums_fp64(blocks).cumsum(dim=-1)  # (B, nb)
    uniform = torch.rand(rows, 1, generator=generator, device=probs.device, dtype=cdf.dtype)
    target = uniform * cdf[:, -1:]
    chosen = torch.searchsorted(cdf, target, right=True).clamp(max=cdf.shape[1] - 1)  # (B, 1)
    before = torch.where(chosen > 0, cdf.gather(1, (chosen - 1).clamp(min=0)), 0.0)
    inside = blocks[torch.arange(rows, device=probs.device), chosen[:, 0]]  # (B, block)
    within = torch.searchsorted(inside.double().cumsum(dim=-1), target - before, right=True)
    return (chosen[:, 0] * block + within[:, 0].clamp(max=block - 1)).clamp(max=vocab - 1)


#: Shortest common start of distinct prompts worth encoding once (`_feed_shared`).
MIN_COMMON_PREFIX = 16


def common_prefix_length(sequences: list[list[int]]) -> int:
    """Tokens at the start that all `sequences` share, capped so each keeps one token
    after it (the last token's logits are read)."""
    shortest = min(len(s) for s in sequences)
    return min(len(os.path.commonprefix(sequences)), shortest - 1)


class HFBackend:
    """`GenerationBackend` over a transformers causal LM (any device, any dtype).

    With `reuse_cache=False` every call re-encodes each session's whole sequence from an
    empty cache: slower, and used to check that cache reuse changes nothing.
    `compute_dtype` other than fp32 runs every forward under `torch.autocast` in that dtype
    (fp32 master weights, bf16 compute, as the trainer's update does).

    `share_histories` (off by default, exact; `rollout.share_histories`): sessions whose
    every token so far is the same read one cache row, so a history that several episodes
    share is encoded once. All rollouts of a group start from one seed, and in a
    deterministic env two episodes that made the same replies get the same next
    observation, token for token; a policy that agrees with itself plays many such
    duplicates. A shared row forks when its sessions sample different tokens, and a fork
    copies every row's cache: cheap on one short turn (the Bandit: rollouts 14% faster),
    dear on long multi-turn histories with few duplicates (Sokoban from an SFT policy: 8%
    duplicate turns, rollouts 2.1x slower; `bench/bench_step.py`). Each session still
    samples from its own row's logits with its own uniform number in request order, so the
    draws are those of one row per session; the padding layout is the same too (chunks are
    padded to the same width).
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        seed: int = 0,
        reuse_cache: bool = True,
        compute_dtype: torch.dtype = torch.float32,
        share_histories: bool = False,
    ):
        self.model = model
        self.pad_token_id = pad_token_id
        self.reuse_cache = reuse_cache
        self.share_histories = share_histories
        self.compute_dtype = compute_dtype
        self.device = next(model.parameters()).device
        self.precision = precision_for(compute_dtype, self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._cache_arg = cache_argument(model)
        self.rows_fed = 0  # cache rows fed (prefill and decode), summed over all calls
        self.tokens_fed = 0  # real tokens fed into those rows (padding excluded)
        # It runs the training model itself: exact log-probs unless autocast rounds them.
        self.numerics = BackendNumerics(
            "hf", str(compute_dtype).removeprefix("torch."), not self.precision.mixed
        )
        self.reset()

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def update_weights(self, model: Any, version: int) -> None:
        """Nothing to copy: this backend samples from the training model's live weights."""
        if model is not self.model:
            raise ValueError("HFBackend samples from the model it was built with")

    def reset(self) -> None:
        self._row_of: dict[int, int] = {}  # session id -> its row of the batch cache
        self._row_count = 0
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # (rows, T)
        self._pending: dict[int, list[int]] = {}  # sampled, not yet fed into the cache
        # Every token fed, per session: only the re-encoding mode needs it.
        self._history: dict[int, list[int]] = {}

    def release(self, sessions: Iterable[int]) -> None:
        gone = set(sessions)
        for session in gone:
            self._pending.pop(session, None)
            self._history.pop(session, None)
        live = [s for s in self._row_of if s not in gone]
        if len(live) != len(self._row_of):
            rows = [self._row_of[s] for s in live]
            self._regroup(
                live, [self._key(s, r, ()) for s, r in zip(live, rows, strict=True)], rows
            )

    @torch.no_grad()
    def generate(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        sessions = [r.session for r in requests]
        chunks = []
        for r in requests:
            chunk = self._pending.pop(r.session, []) + list(r.new_token_ids)
            if not self.reuse_cache:
                self._history.setdefault(r.session, []).extend(chunk)
            chunks.append(chunk)
        if not self.reuse_cache:
            chunks = [list(self._history[s]) for s in sessions]
            self._row_of = {}  # every call starts from an empty cache
        known = [s in self._row_of for s in sessions]
        if any(known) and not all(known):
            raise ValueError("start all sessions of a batch in one generate() call")
        with self.precision.autocast():
            if any(known):
                parents = [self._row_of[s] for s in sessions]
                keys = [
                    self._key(s, p, tuple(c))
                    for s, p, c in zip(sessions, parents, chunks, strict=True)
                ]
                rows, firsts = self._regroup(sessions, keys, parents)
                logits = self._feed([chunks[i] for i in firsts])
            else:
                rows, logits = self._start_sessions(sessions, chunks)
            return self._decode(sessions, rows, logits, params)

    # ------------------------------------------------------------------ batch state
    def _key(self, session: int, row: int, tail: tuple) -> tuple:
        """What decides a session's next cache row: its current row and the tokens it
        appends when histories are shared, else the session itself (a row each)."""
        return (row, tail) if self.share_histories else (session,)

    def _regroup(
        self, sessions: list[int], keys: list[tuple], parents: list[int]
    ) -> tuple[list[int], list[int]]:
        """Cache rows become the distinct `keys` in order of first appearance, each a copy
        of the current row `parents[i]` of its first session i (rows no session reads are
        dropped). Returns (each session's new row, each new row's first session)."""
        new_row: dict[tuple, int] = {}
        rows = [new_row.setdefault(key, len(new_row)) for key in keys]
        firsts = [0] * len(new_row)
        for i in reversed(range(len(sessions))):
            firsts[rows[i]] = i
        index = [parents[i] for i in firsts]
        if index != list(range(self._row_count)):
            if not index:
                self._empty_cache(0)
            elif self._cache is not None and self._cache.get_seq_length() > 0:
                self._copy_rows(torch.tensor(index, device=self.device))
            else:
                self._mask = self._mask[index]
        self._row_of = dict(zip(sessions, rows, strict=True))
        self._row_count = len(firsts)
        return rows, firsts

    def _start_sessions(
        self, sessions: list[int], chunks: list[list[int]]
    ) -> tuple[list[int], torch.Tensor]:
        """New sessions' first chunks into an empty cache: each distinct prompt encoded
        once (`_feed_prompts`); (each session's row, the rows' last logits)."""
        logits, index = self._feed_prompts(chunks)
        distinct = len(logits)
        if self.share_histories:
            rows = index
            if distinct < len(chunks):  # the prompts become blocks that later forks share
                self._share_rows(torch.arange(distinct, device=self.device))
        else:
            rows = list(range(len(chunks)))
            index_t = torch.tensor(index, device=self.device)
            if distinct < len(chunks):
                self._share_rows(index_t)
            elif index != rows:
                self._copy_rows(index_t)
            logits = logits[index_t]
        self._row_of = dict(zip(sessions, rows, strict=True))
        self._row_count = len(logits)
        return rows, logits

    def _empty_cache(self, rows: int) -> None:
        """An empty cache and attention mask for `rows` sequences."""
        self._cache = DynamicCache()
        self._mask = torch.zeros(rows, 0, dtype=torch.long, device=self.device)

    def _forward(self, input_ids: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
        """Feed (B, L) tokens whose mask is `new_mask`; return the last position's logits."""
        positions = self._extend_mask(new_mask)
        out = self.model(
            input_ids=input_ids,
            attention_mask=self._mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: self._cache},
        )
        self._cache = out[self._cache_arg]
        return out.logits[:, -1]  # (B, V)

    def _extend_mask(self, new_mask: torch.Tensor) -> torch.Tensor:
        """Append (B, L) `new_mask` to the attention mask; return the new tokens' position
        ids, which count only real tokens (a sequence sees the positions it would alone)."""
        self._mask = torch.cat([self._mask, new_mask], dim=1)
        self.rows_fed += new_mask.shape[0]
        self.tokens_fed += int(new_mask.sum())
        return (self._mask.cumsum(dim=1) - 1).clamp(min=0)[:, -new_mask.shape[1] :]

    def _feed(self, chunks: list[list[int]]) -> torch.Tensor:
        """Left-pad the chunks into one (B, L) block so every row's last column is real."""
        if any(not chunk for chunk in chunks):
            raise ValueError("every request must bring at least one new token")
        width = max(len(chunk) for chunk in chunks)
        ids = torch.full((len(chunks), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(chunks), width, dtype=torch.long)
        for row, chunk in enumerate(chunks):
            ids[row, width - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
            mask[row, width - len(chunk) :] = 1
        return self._forward(ids.to(self.device), mask.to(self.device))

    def _feed_prompts(self, chunks: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
        """First chunks of new sessions: encode each distinct prompt once (all rollouts of
        a group start from the same prompt); the cache rows are the distinct prompts.
        Returns (their last logits, each chunk's distinct prompt). The distinct prompts'
        common start (the system prompt and instructions, 151 of Sokoban's ~225 tokens)
        is encoded once too, when it is at least MIN_COMMON_PREFIX tokens long."""
        first_row: dict[tuple[int, ...], int] = {}
        index = [first_row.setdefault(tuple(chunk), len(first_row)) for chunk in chunks]
        distinct = [list(chunk) for chunk in first_row]
        common = common_prefix_length(distinct) if len(distinct) > 1 else 0
        if common < MIN_COMMON_PREFIX:
            self._empty_cache(len(distinct))
            return self._feed(distinct), index
        self._empty_cache(1)
        self._feed([distinct[0][:common]])
        self._give_common_start(len(distinct))
        return self._feed([chunk[common:] for chunk in distinct]), index

    def _give_common_start(self, rows: int) -> None:
        """The one row holding the prompts' common start becomes `rows` rows: a copy each
        here; the lean backend's cache lets them all read one block."""
        self._copy_rows(torch.zeros(rows, dtype=torch.long, device=self.device))

    def _copy_rows(self, rows: torch.Tensor) -> None:
        """Cache and mask rows `rows` of the current ones (repeats copy a row)."""
        self._cache.batch_select_indices(rows)
        self._mask = self._mask[rows]

    def _share_rows(self, rows: torch.Tensor) -> None:
        """Rows `rows` of the distinct prompts just encoded (repeats: rollouts of a group).
        A copy each here; a cache that can share one prompt between rows overrides this."""
        self._copy_rows(rows)

    def _decode(
        self, sessions: list[int], rows: list[int], logits: torch.Tensor, params: SamplingParams
    ) -> list[Generation]:
        """Sample up to max_new_tokens per session from its row's logits; finished
        sessions feed padding (mask 0). Rows fork where their sessions' tokens differ."""
        n = len(sessions)
        tokens_out: list[list[int]] = [[] for _ in range(n)]
        logprobs_out: list[list[float]] = [[] for _ in range(n)]
        stops: list[list[int] | None] = [None] * n
        for step in range(params.max_new_tokens):
            if len(logits) != n or rows != list(range(n)):  # a row per session, as drawn
                logits = logits.index_select(0, torch.tensor(rows, device=logits.device))
            tokens, logprobs = sample_tokens(
                logits, params.temperature, params.top_p, self.generator
            )
            logits = None  # a (B, V) matrix: not kept through the next forward
            active = [stops[i] is None for i in range(n)]
            token_list, logprob_list = tokens.tolist(), logprobs.tolist()  # one copy each
            for i in range(n):
                if active[i]:
                    tokens_out[i].append(token_list[i])
                    logprobs_out[i].append(logprob_list[i])
                    stops[i] = ends_with_stop(tokens_out[i], params)
            if step == params.max_new_tokens - 1 or all(s is not None for s in stops):
                for i in range(n):
                    if active[i]:
                        self._pending[sessions[i]] = [token_list[i]]
                break
            fed = [token_list[i] if active[i] else None for i in range(n)]
            if not self.reuse_cache:
                for i in range(n):
                    if active[i]:
                        self._history[sessions[i]].append(token_list[i])
            keys = [self._key(s, r, (t,)) for s, r, t in zip(sessions, rows, fed, strict=True)]
            rows, firsts = self._regroup(sessions, keys, rows)
            feed = [fed[i] for i in firsts]
            ids = [self.pad_token_id if t is None else t for t in feed]
            real = [int(t is not None) for t in feed]
            logits = self._forward(
                torch.tensor(ids, device=self.device)[:, None],
                torch.tensor(real, device=self.device)[:, None],
            )
        return [
            Generation(
                tokens_out[i], logprobs_out[i], "stop" if stops[i] else "length", stops[i] or []
            )
            for i in range(n)
        ]


def build_hf_backend(
    model: Any, tokenizer: Any, *, compute_dtype: torch.dtype = torch.float32, seed: int = 0
) -> HFBackend:
    """The "hf" entry of starpo.registry.GENERATION_BACKENDS: sample from `model` itself."""
    return HFBackend(
        model, pad_token_id=tokenizer.pad_token_id, seed=seed, compute_dtype=compute_dtype
    )
