"""A lean decode loop for Llama-family models: the "lean" generation backend.

Same sessions, shared-prompt encoding and sampling as `HFBackend`, with a faster forward:

- The KV cache is preallocated per layer and grown rarely (`lean_kv_store.KVStore`): a
  decode step writes one column in place, where `DynamicCache` concatenated the whole cache
  every step (its cost grew with the length and the batch: 54 ms of a 150 ms step at
  batch 32).
- The decoder layers run as a dozen plain tensor ops each (`lean_decoder.LeanLlama`),
  without the transformers module stack and its per-call mask building.
- The weights may be a bf16 copy (`weights_dtype=torch.bfloat16`), synced from the training
  model after every update. A decode step reads every weight once, so halving the bytes
  halves its time; on CPUs with AVX512-BF16 the bf16 matmul is also faster in itself. The
  residual stream, norms, rotary embedding, softmax and sampling stay in fp32. The
  log-probs then differ slightly from the training model's (`numerics.exact_logprobs` is
  False), so the trainer recomputes the PPO ratio's old log-probs, as verl does with vLLM.
  With fp32 weights the lean forward uses the training model's own tensors (no copy) and
  its log-probs match the transformers forward within fp32 rounding.
- Padding is dropped before each turn's decoding (`drop_padding`): a batch's cache is
  rectangular, so every row gets the longest row's chunk of a turn and a column every
  decode step after its own reply ended, masked but read by every later step. Moving each
  row's real columns to the front leaves the same keys for each row's attention, in the
  same order (exact up to the order of float sums), for one copy of the rows' own columns
  a turn. It pays where replies end at different lengths; where all run to their budget
  (the base model on invoice) it saved nothing (0.99x, bench/bench_shared_start.py).
- The cache may hold bf16 keys and values (`kv_dtype`, rollout.kv_dtype): a decode step's
  attention reads every cached column once a row, so half the bytes take less time (on a
  2-core Xeon with native bf16: 64 rows x 1,500 columns, 8.89 ms fp32 against 6.18 ms
  bf16, `bench/bench_decode_attention.py`). The values are bf16 already when the weights
  are; the keys get one more rounding after their rotary embedding. Opt-in: inexact,
  like bf16 weights.

Supported: decoder-only Llama-shaped models (Llama, SmolLM, Qwen2, Mistral without sliding
window): `lean_support(model)` names what is missing otherwise, and the "auto" backend then
falls back to `HFBackend`.
"""

from __future__ import annotations

from typing import Any

import torch

from starpo.rollout.backends.base import BackendNumerics
from starpo.rollout.backends.hf import HFBackend, build_hf_backend
from starpo.rollout.backends.lean_decoder import LeanLlama, attention_mask, lean_support


class LeanBackend(HFBackend):
    """`HFBackend`'s sessions and sampling on `LeanLlama`'s forward and `KVStore` cache."""

    def __init__(
        self,
        model: Any,
        *,
        pad_token_id: int,
        seed: int = 0,
        weights_dtype: torch.dtype = torch.float32,
        linear_kernel: str = "auto",
        share_histories: bool = False,
    ):
        reason = lean_support(model)
        if reason is not None:
            raise ValueError(
                f"the lean backend cannot run this model: {reason}; use rollout.backend=hf"
            )
        self.lean = LeanLlama(model, weights_dtype, linear_kernel)
        # No autocast: the lean forward picks each op's dtype itself.
        super().__init__(
            model, pad_token_id=pad_token_id, seed=seed, share_histories=share_histories
        )
        self.compute_dtype = weights_dtype
        self.numerics = self._numerics(self.lean.kv_dtype)
        self.room = 0  # columns the current generate() call may still append
        # Exact either way (the same tokens, log-probs within fp32 rounding); off only to
        # measure it (bench/bench_shared_start.py).
        self.share_common_start = True
        # Exact up to float rounding; off only to measure it (bench/bench_step.py,
        # bench/bench_shared_start.py).
        self.drop_padding = True

    @property
    def kv_dtype(self) -> torch.dtype:
        """The cache's dtype (`rollout.kv_dtype`), for the next call's cache: fp32 (exact
        with fp32 weights), or bf16 (half the bytes decode attention reads)."""
        return self.lean.kv_dtype

    @kv_dtype.setter
    def kv_dtype(self, dtype: torch.dtype) -> None:
        self.lean.kv_dtype = dtype
        self.numerics = self._numerics(dtype)

    def _numerics(self, cache: torch.dtype) -> BackendNumerics:
        """Exact only with fp32 weights and an fp32 cache."""
        weights = str(self.compute_dtype).removeprefix("torch.")
        exact = self.compute_dtype == torch.float32 and cache == torch.float32
        kv = str(cache).removeprefix("torch.")
        return BackendNumerics("lean", weights, exact, self.lean.kernel, kv)

    def update_weights(self, model: Any, version: int) -> None:
        super().update_weights(model, version)
        self.lean.sync()  # the fused (and any bf16) copies follow the optimizer step

    def generate(self, requests, params):
        # Reserve the whole turn (its longest new chunk and every decode step) up front.
        longest = max((len(r.new_token_ids) for r in requests), default=0)
        self.room = longest + 1 + params.max_new_tokens
        return super().generate(requests, params)

    def _decode(self, sessions, rows, logits, params):
        if self.drop_padding:
            self._drop_padding()
        return super()._decode(sessions, rows, logits, params)

    def _drop_padding(self) -> None:
        """Each row's real own columns to the front (`KVStore.compact`), the mask with
        them: the turn's decode steps then read no padding from earlier turns or this
        turn's feed. Positions are counted from the mask, so they do not change."""
        store = self._cache
        if store is None or not store.rows:
            return
        real = self._mask[:, store.shared :].bool()
        counts = real.sum(dim=1)
        columns = int(counts.max())
        if columns == real.shape[1]:
            return  # some row is real in every column: nothing to gain
        # A stable sort of "is padding" puts each row's real columns first, in order.
        order = torch.sort((~real).to(torch.uint8), dim=1, stable=True).indices
        store.compact(order, columns)
        own = torch.arange(columns, device=self.device)[None, :] < counts[:, None]
        self._mask = torch.cat([self._mask[:, : store.shared], own.long()], dim=1)

    def _empty_cache(self, rows: int) -> None:
        super()._empty_cache(rows)
        self._cache = self.lean.new_store(rows, self.device)

    def _share_rows(self, rows: torch.Tensor) -> None:
        self._cache.share(rows)  # the prompts' blocks, read by index: no copy per row
        self._mask = self._mask[rows]

    def _give_common_start(self, rows: int) -> None:
        # One block every row reads (the system prompt, a tool env's ~500 tokens of tool
        # schemas and rules): attention reads it once a step for all rows, where a copy
        # per distinct prompt was read once per row in an evaluation (every case its own
        # prompt). A group's prompt shared later folds it into the group's block.
        if self.share_common_start:
            self._share_rows(torch.zeros(rows, dtype=torch.long, device=self.device))
        else:
            super()._give_common_start(rows)

    def _forward(self, input_ids: torch.Tensor, new_mask: torch.Tensor) -> torch.Tensor:
        positions = self._extend_mask(new_mask)
        width, store = input_ids.shape[1], self._cache
        store.ensure(store.length + max(width, self.room))
        self.room = 0  # reserved: the call's decode steps fit in it
        return self.lean.forward(input_ids, positions, attention_mask(self._mask, width), store)


def build_lean_backend(
    model: Any, tokenizer: Any, *, compute_dtype: torch.dtype = torch.float32, seed: int = 0
) -> LeanBackend:
    """The "lean" entry of starpo.registry.GENERATION_BACKENDS (weights in `compute_dtype`)."""
    return LeanBackend(
        model, pad_token_id=tokenizer.pad_token_id, seed=seed, weights_dtype=compute_dtype
    )


def auto_picks_lean(on_cpu: bool, unsupported: str | None) -> bool:
    """Whether rollout.backend=auto runs the lean decoder: on a CPU (where it was
    measured faster), for a model it supports (`unsupported` None: see `lean_support`).
    The memory plan asks the same question before any model loads."""
    return on_cpu and unsupported is None


def build_auto_backend(
    model: Any, tokenizer: Any, *, compute_dtype: torch.dtype = torch.float32, seed: int = 0
) -> HFBackend:
    """The "auto" entry: the lean decoder for a Llama-shaped model on a CPU, where it was
    measured; `HFBackend` otherwise (other architectures, LoRA, GPUs)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    if auto_picks_lean(on_cpu, lean_support(model)):
        return build_lean_backend(model, tokenizer, compute_dtype=compute_dtype, seed=seed)
    return build_hf_backend(model, tokenizer, compute_dtype=compute_dtype, seed=seed)
