"""The lean decoder: a Llama-family model's forward for generation as a dozen plain tensor
ops a layer (`LeanLlama`), without the transformers module stack and its per-call mask
building, on a `KVStore` cache.

The weights may be a bf16 copy (`weights_dtype=torch.bfloat16`), synced from the training
model after every update (`LeanLlama.sync`). A decode step reads every weight once, so
halving the bytes halves its time; on CPUs with AVX512-BF16 the bf16 matmul is also faster
in itself. The residual stream, norms, rotary embedding, softmax and sampling stay in
fp32. With fp32 weights the lean forward uses the training model's own tensors (no copy)
and its log-probs match the transformers forward within fp32 rounding.

Supported: decoder-only Llama-shaped models (Llama, SmolLM, Qwen2, Mistral without sliding
window); `lean_support(model)` names what is missing otherwise.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from starpo.models.compat import uses_sliding_window
from starpo.rollout.backends.lean_kv_store import KVStore
from starpo.rollout.backends.linear_kernels import pack_weight, pick_linear

#: Model types whose decoder layers are exactly what `LeanLlama` computes.
LEAN_MODEL_TYPES = ("llama", "qwen2", "mistral")
#: Query rows from which a feed over shared prompt blocks copies them into each row and
#: runs one fused attention call, instead of attending part by part (`attend_parts`,
#: whose additive bias grows with width x columns). Measured on 2 cores (SmolLM2, fp32
#: cache, 64 rows over a 661-column shared block and 700 own columns, a whole forward):
#: block by block 0.25 s against 1.38 s at 1 row, 1.25 against 2.34 s at 16, 4.27
#: against 5.06 s at 60 (a turn's observation).
FUSED_SHARED_WIDTH = 64


def lean_config_support(config: Any, lora: bool = False) -> str | None:
    """Why a model of this config (a transformers config; with LoRA adapters when `lora`)
    cannot run on the lean decoder, or None when it can, as far as the config tells: the
    memory plan asks this before any model loads, `lean_support` again on the model."""
    model_type = getattr(config, "model_type", None)
    if model_type not in LEAN_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(LEAN_MODEL_TYPES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not silu"
    if uses_sliding_window(config):
        return "sliding-window attention is not implemented"
    if lora:
        return "LoRA adapters are not merged into the lean decoder's weights"
    return None


def lean_support(model: Any) -> str | None:
    """Why `model` cannot run on the lean decoder, or None when it can."""
    config = getattr(model, "config", None)
    reason = lean_config_support(config, lora=bool(getattr(model, "peft_config", None)))
    if reason is not None:
        return reason
    inner = getattr(model, "model", None)
    if not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no model.layers / model.rotary_emb (not a Llama-shaped model)"
    return None


@dataclass
class LayerWeights:
    """One decoder layer's tensors for the lean forward. The q/k/v and gate/up projections
    are fused into one matrix each (one matmul reads them all: fewer, larger calls), always
    a copy; the others alias the model's tensors when the dtype matches."""

    input_norm: torch.Tensor
    qkv: torch.Tensor  # (q_heads + 2 kv_heads) * head_dim rows
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # 2 * intermediate rows
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


def _layer_parts(layer: Any) -> dict[str, list[torch.Tensor | None]]:
    """The model's tensors behind each `LayerWeights` field (several for a fused one)."""
    attn, mlp = layer.self_attn, layer.mlp
    return {
        "input_norm": [layer.input_layernorm.weight],
        "qkv": [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight],
        "qkv_bias": [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias],
        "o": [attn.o_proj.weight],
        "o_bias": [attn.o_proj.bias],
        "post_norm": [layer.post_attention_layernorm.weight],
        "gate_up": [mlp.gate_proj.weight, mlp.up_proj.weight],
        "gate_up_bias": [mlp.gate_proj.bias, mlp.up_proj.bias],
        "down": [mlp.down_proj.weight],
        "down_bias": [mlp.down_proj.bias],
    }


def _build(parts: list[torch.Tensor | None], dtype: torch.dtype) -> torch.Tensor | None:
    """One tensor from `parts`: an alias of a single part in its own dtype, else a copy."""
    if any(p is None for p in parts):
        return None
    if len(parts) == 1:
        return parts[0].detach().to(dtype)  # no copy when the dtype matches
    return torch.cat([p.detach() for p in parts]).to(dtype)


def _refill(target: torch.Tensor | None, parts: list[torch.Tensor | None]) -> None:
    """Copy the model's current `parts` into `target` (skipped when it aliases them)."""
    if target is None or (len(parts) == 1 and target.data_ptr() == parts[0].data_ptr()):
        return
    start = 0
    for part in parts:
        target[start : start + len(part)].copy_(part)
        start += len(part)


@dataclass
class AttentionTally:
    """Where decoding's attention time goes (`LeanLlama.attention`; bench/bench_step.py
    prints it): seconds spent in attention and the key and value bytes it read, for decode
    steps (one query a row: bound by memory bandwidth, every cached column read once per
    step) and for wider feeds (prompts, observations) apart."""

    decode_s: float = 0.0
    decode_bytes: int = 0
    feed_s: float = 0.0
    feed_bytes: int = 0

    def add(self, decode: bool, seconds: float, read: int) -> None:
        if decode:
            self.decode_s += seconds
            self.decode_bytes += read
        else:
            self.feed_s += seconds
            self.feed_bytes += read


def kv_bytes_read(keys: torch.Tensor, parts: list[SharedPart]) -> int:
    """Key and value bytes one layer's attention reads: every row's own columns, plus each
    shared block read (once for all the rows that read it, `attend_parts`)."""
    read = 2 * keys.numel() * keys.element_size()
    for part in parts:
        block = part.keys[0]
        read += 2 * part.read.block_count * block.numel() * block.element_size()
    return read


@dataclass(frozen=True)
class SharedPart:
    """One level of a layer's shared prompt tree as attention reads it: the level's
    blocks (blocks, kv_heads, columns, head_dim) and how one call reads them (`LevelRead`)."""

    keys: torch.Tensor
    values: torch.Tensor
    read: LevelRead


@dataclass(frozen=True)
class LevelRead:
    """How one attention call reads a level of the shared prompt tree: each block some
    row reads is one batch entry of the call, its readers' queries stacked as its query
    rows, padded to the most readers any block has (a padding slot repeats the block's
    first reader; its output is dropped). The same in every layer: a forward builds it
    once (`level_reads`).

    blocks: the blocks read, in order (None: every block, so the level's keys and values
    are used as they are, not gathered); slots: (blocks x most,) the row in each slot;
    readers: the rows of the real slots, in slot order; real: (blocks x most,) bool;
    bias: (blocks, 1, most x query rows, columns), additive, over the level's columns."""

    blocks: torch.Tensor | None
    slots: torch.Tensor
    readers: torch.Tensor
    real: torch.Tensor
    bias: torch.Tensor

    @property
    def block_count(self) -> int:
        return self.bias.shape[0]


def level_reads(levels: list[Any], bias: torch.Tensor) -> list[LevelRead]:
    """Each level's `LevelRead`, from the forward's bias (B, 1, query rows, T) whose first
    columns are the levels' in order."""
    reads, start = [], 0
    for level in levels:
        span = slice(start, start + level.columns)
        start = span.stop
        groups = level.groups()
        most = max(len(members) for _, members in groups)
        slots = torch.cat(
            [torch.cat([members, members[:1].expand(most - len(members))]) for _, members in groups]
        )
        device = level.rows.device
        real = torch.cat(
            [torch.arange(most, device=device) < len(members) for _, members in groups]
        )
        blocks = torch.tensor([block for block, _ in groups], device=device)
        every = len(groups) == level.keys[0].shape[0]  # groups() lists blocks in order
        reads.append(
            LevelRead(
                blocks=None if every else blocks,
                slots=slots,
                readers=slots[real],
                real=real,
                bias=bias[slots, 0, :, span].reshape(len(groups), 1, -1, level.columns),
            )
        )
    return reads


class LeanLlama:
    """The decoder's forward for generation: token ids in, last-position logits out."""

    def __init__(
        self,
        model: Any,
        weights_dtype: torch.dtype,
        linear_kernel: str = "auto",
        kv_dtype: torch.dtype = torch.float32,
    ):
        config = model.config
        self.model = model
        self.dtype = weights_dtype
        self.kv_dtype = kv_dtype
        device = next(model.parameters()).device
        self.kernel, self.linear = pick_linear(linear_kernel, weights_dtype, device)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.rotary = model.model.rotary_emb
        self.layers = [
            LayerWeights(**{k: _build(v, weights_dtype) for k, v in _layer_parts(layer).items()})
            for layer in model.model.layers
        ]
        self.embed = _build([model.model.embed_tokens.weight], weights_dtype)
        self.final_norm = _build([model.model.norm.weight], weights_dtype)
        head = model.get_output_embeddings().weight
        tied = head.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        self.lm_head = self.embed if tied else _build([head], weights_dtype)
        self.attention = AttentionTally()  # read by benches; costs two clock reads a layer
        self._pack()

    def _pack(self) -> None:
        """The matrices in the layout the matmul kernel reads (the same tensors for
        F.linear): `self.layers` keep the dense weights that `sync` refills."""
        matrices = ("qkv", "o", "gate_up", "down")
        self.run_layers = [
            dataclasses.replace(w, **{m: pack_weight(self.kernel, getattr(w, m)) for m in matrices})
            for w in self.layers
        ]
        self.run_head = pack_weight(self.kernel, self.lm_head)

    @torch.no_grad()
    def sync(self) -> None:
        """Bring the copies up to the model's current weights (after an optimizer step)."""
        for mine, layer in zip(self.layers, self.model.model.layers, strict=True):
            for name, parts in _layer_parts(layer).items():
                _refill(getattr(mine, name), parts)
        _refill(self.embed, [self.model.model.embed_tokens.weight])
        _refill(self.final_norm, [self.model.model.norm.weight])
        if self.lm_head is not self.embed:
            _refill(self.lm_head, [self.model.get_output_embeddings().weight])
        if self.kernel != "torch":
            self._pack()  # a packed copy never aliases the model: re-pack the new weights

    def new_store(self, rows: int, device: torch.device) -> KVStore:
        # fp32 keys and values unless asked otherwise (rollout.kv_dtype): bf16 halves the
        # bytes a decode step's attention reads (1.44x faster on a 2-core native-bf16 CPU,
        # `_FLASH_CPU`), at one more rounding of each key (values are bf16 already when
        # the weights are).
        return KVStore(len(self.layers), rows, self.kv_heads, self.head_dim, self.kv_dtype, device)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in fp32 (as transformers does), then the weights' dtype for the matmul."""
        return F.rms_norm(x, x.shape[-1:], weight.float(), self.eps).to(self.dtype)

    @torch.no_grad()
    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, attend: torch.Tensor, store: KVStore
    ) -> torch.Tensor:
        """ids, positions: (B, L); attend: (B, 1, L, length + L) bool. Appends L columns
        to `store`; returns the last position's logits (B, V) in fp32."""
        rows, width = ids.shape
        rotated = self.heads + self.kv_heads  # q and k heads, adjacent in the qkv output
        x = self.embed[ids].float()  # the residual stream stays fp32
        cos, sin = self.rotary(x, positions)  # (B, L, head_dim)
        cos, sin = cos[:, None], sin[:, None]
        # One query row (decode), or shared prompt blocks (`KVStore.share`): each part of
        # the keys (a level's blocks, the rows' own columns) attended apart and merged by
        # log-sum-exp, a block read once for all the rows reading it, the query heads of a
        # kv head stacked as one call's query rows. A wide feed (a prompt, a turn's
        # observation) over no levels, or over levels copied into each row's keys (from
        # FUSED_SHARED_WIDTH rows on): one fused call with the mask, no extra (L, T) bias.
        copy_blocks = bool(store.levels) and width >= FUSED_SHARED_WIDTH
        read_levels = [] if copy_blocks else store.levels  # the levels read apart
        manual = width == 1 or bool(read_levels)
        bias = attention_bias(attend, self.heads // self.kv_heads) if manual else None
        reads = level_reads(read_levels, bias)  # [] when no level is read apart
        own_bias = bias[..., store.shared :] if read_levels else bias
        for i, w in enumerate(self.run_layers):
            qkv = self.linear(self._norm(x, w.input_norm), w.qkv, w.qkv_bias).float()
            qkv = qkv.view(rows, width, -1, self.head_dim).transpose(1, 2)  # (B, heads, L, D)
            qk = _rotate(qkv[:, :rotated], cos, sin)
            keys, values = store.write(i, qk[:, self.heads :], qkv[:, rotated:])
            queries = qk[:, : self.heads]
            started = time.perf_counter()
            if copy_blocks:
                shared_keys, shared_values = store.shared_columns(i)
                keys = torch.cat([shared_keys, keys], dim=2)
                values = torch.cat([shared_values, values], dim=2)
            parts = [
                SharedPart(level.keys[i], level.values[i], read)
                for level, read in zip(read_levels, reads, strict=True)
            ]
            if bias is None:
                att = F.scaled_dot_product_attention(
                    queries.to(keys.dtype),
                    keys,
                    values,
                    attn_mask=attend,
                    scale=self.head_dim**-0.5,
                    enable_gqa=True,
                ).float()
            else:
                att = attend_parts(queries, self.kv_heads, keys, values, own_bias, parts)
            self.attention.add(
                width == 1, time.perf_counter() - started, kv_bytes_read(keys, parts)
            )
            att = att.transpose(1, 2).reshape(rows, width, -1).to(self.dtype)
            x = x + self.linear(att, w.o, w.o_bias).float()
            gate_up = self.linear(self._norm(x, w.post_norm), w.gate_up, w.gate_up_bias)
            gate, up = gate_up.chunk(2, -1)
            x = x + self.linear(F.silu(gate) * up, w.down, w.down_bias).float()
        store.length += width
        return self.linear(self._norm(x[:, -1], self.final_norm), self.run_head, None).float()


def attend_parts(
    q: torch.Tensor,
    kv_heads: int,
    keys: torch.Tensor,
    values: torch.Tensor,
    own_bias: torch.Tensor,
    parts: list[SharedPart],
) -> torch.Tensor:
    """Attention of q (B, heads, L, D) over the shared prompt tree's levels (`parts`) and
    each row's own keys and values (B, kv_heads, T, D), with `own_bias` over those, one
    call a part, merged by their log-sum-exps (`merge_parts`). A level's call has one
    batch entry a block, the rows reading it stacked as its query rows (`LevelRead`), so
    a block is read once per step however many rows read it, and a level of many blocks
    (an RL step's cases) costs one call, not one a block. The query heads sharing a kv
    head are stacked as extra query rows too, so keys and values are never repeated
    (grouped-query attention)."""
    rows, heads, width, dim = q.shape
    grouped = q.reshape(rows, kv_heads, heads // kv_heads * width, dim)
    queries = grouped.shape[2]
    outs, lses = [], []
    for part in parts:
        read = part.read
        blocks = read.block_count
        stacked = grouped[read.slots].view(blocks, -1, kv_heads, queries, dim).transpose(1, 2)
        level_keys, level_values = part.keys, part.values
        if read.blocks is not None:
            level_keys, level_values = level_keys[read.blocks], level_values[read.blocks]
        block_out, block_lse = attend_with_lse(
            stacked.reshape(blocks, kv_heads, -1, dim), level_keys, level_values, read.bias
        )
        # (blocks, kv_heads, most x queries, ...) back to one entry a slot, then a row
        block_out = block_out.view(blocks, kv_heads, -1, queries, dim).transpose(1, 2)
        block_lse = block_lse.view(blocks, kv_heads, -1, queries).transpose(1, 2)
        out = grouped.new_empty(rows, kv_heads, queries, dim)
        lse = grouped.new_empty(rows, kv_heads, queries)
        out[read.readers] = block_out.reshape(-1, kv_heads, queries, dim)[read.real]
        lse[read.readers] = block_lse.reshape(-1, kv_heads, queries)[read.real]
        outs.append(out)
        lses.append(lse)
    own_out, own_lse = attend_with_lse(grouped, keys, values, own_bias)
    merged = merge_parts([*outs, own_out], [*lses, own_lse])
    return merged.view(rows, heads, width, dim)


#: PyTorch's fused CPU attention kernel, which also returns each query's log-sum-exp (the
#: public `scaled_dot_product_attention` drops it). One decode step's attention (64 rows,
#: 3 kv heads x 3 queries, 1,500 keys; `bench/bench_decode_attention.py`, 2-core Xeon with
#: native bf16): 8.89 ms fp32 against 11.26 ms for two matmuls around a softmax, 6.18 ms
#: with bf16 keys and values (half the bytes). On a 2-core AVX2-only EPYC the three are
#: within run-to-run noise of each other (14.5-17 ms): the kernel is not memory-bound there.
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend_with_lse(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q (N, H, M, D) over keys and values (N, H, T, D) with an
    additive bias (N, 1, M, T) of 0 / -inf, or None: the output (N, H, M, D) and each
    query's log-sum-exp of its scaled scores (N, H, M), both fp32. q is cast to the keys'
    dtype (bf16 keys: bf16 products, fp32 sums). Every query must see at least one key
    (the fused kernel returns a log-sum-exp of 0 for a query that sees none)."""
    scale = q.shape[-1] ** -0.5
    if q.device.type == "cpu" and _FLASH_CPU is not None:
        out, lse = _FLASH_CPU(
            q.to(keys.dtype), keys, values, 0.0, False, attn_mask=bias, scale=scale
        )
        return out.float(), lse.float()
    scores = torch.matmul(q, keys.transpose(-1, -2).to(q.dtype)) * scale
    if bias is not None:
        scores = scores + bias
    lse = scores.logsumexp(dim=-1)
    return torch.matmul((scores - lse[..., None]).exp(), values.to(q.dtype)), lse


def merge_parts(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> torch.Tensor:
    """One softmax over several key spans from each span's attention output (N, H, M, D)
    and log-sum-exp (N, H, M): each output weighted by its span's share of the total
    probability mass, exp(lse - total)."""
    if len(outs) == 1:
        return outs[0]
    total = torch.logsumexp(torch.stack(lses), dim=0)
    merged = torch.zeros_like(outs[0])
    for out, lse in zip(outs, lses, strict=True):
        merged += (lse - total).exp()[..., None] * out
    return merged


def attention_bias(attend: torch.Tensor, group: int) -> torch.Tensor:
    """(B, 1, L, T) bool -> (B, 1, group * L, T) additive fp32 (0 or -inf), repeated for
    the query heads of a group, as `attend_parts` stacks them."""
    bias = torch.zeros(attend.shape, dtype=torch.float32, device=attend.device)
    bias = bias.masked_fill(~attend, float("-inf"))
    rows, _, width, total = bias.shape
    return bias[:, :, None].expand(rows, 1, group, width, total).reshape(rows, 1, -1, total)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (the rotate-half form Llama checkpoints use)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def attention_mask(real: torch.Tensor, width: int) -> torch.Tensor:
    """(B, 1, width, T) bool: the last `width` of T positions are queries; a query sees
    real keys (mask 1) up to itself, and always itself, so a padding query's softmax has one
    finite term (its output is never read, but a NaN would leak into later layers' keys)."""
    total = real.shape[1]
    key = torch.arange(total, device=real.device)
    query = torch.arange(total - width, total, device=real.device)[:, None]  # (width, 1)
    causal = key[None, :] <= query  # (width, T)
    own = key[None, :] == query
    return (real.bool()[:, None, None, :] & causal) | own
