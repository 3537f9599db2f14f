"""How much of the machine a training forward/backward uses: the useful matmul FLOPs it
computes, and the matmul peak they are set against (model FLOPs utilisation). One rule
for `bench/bench_update.py`, `starpo sft` and the trainer's `perf/update_*` metrics.

FLOPs are counted from the shapes a pass computes, not as 6 x parameters x tokens:

- the decoder's linear layers for every token the pass runs: a prompt shared by a
  micro-batch's rows once, then each row's own tokens, padded to the widest row on the
  shared-KV-cache and plain paths, unpadded when the rows are packed (`forward.hidden_at`
  picks the path; this module asks it the same questions);
- causal attention over the (query, key) pairs a causal model needs (q.k and p.v);
- the LM head at the rows it runs on.

A backward pass does two matmuls of its forward's size per matmul: x3 with gradients.
Element-wise work (norms, activations, softmax) is not counted: it is not matmul work, so
the figure says how close the pass runs to the matmul peak.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace

import torch
from torch import nn

from starpo.compute import forward
from starpo.compute.batch import TrainBatch
from starpo.compute.segments import split_parts
from starpo.models.precision import Precision

#: Forward + backward: the backward computes two matmuls of each forward matmul's size
#: (the input's gradient and the weight's) ...
WITH_BACKWARD = 3
#: ... or one, when the weights are frozen (LoRA: the adapters' own matmuls are small).
WITH_FROZEN_BACKWARD = 2


@dataclass(frozen=True)
class Shape:
    """The dimensions of a decoder-only transformer that its FLOPs depend on."""

    hidden: int
    intermediate: int
    layers: int
    kv_hidden: int  # hidden x kv heads / query heads (grouped-query attention)
    vocab: int

    @property
    def layer_weights(self) -> int:
        """Multiply-adds of one token through one layer's linear maps: q and o (H x H),
        k and v (H x kv), the gated MLP's three (H x I)."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_hidden + 3 * h * self.intermediate


def model_shape(model: nn.Module) -> Shape | None:
    """The model's `Shape` from its Hugging Face config (Llama-style names: SmolLM2,
    Qwen2, Mistral, ...); None for a model whose config names them otherwise."""
    config = getattr(model, "config", None)
    try:
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return Shape(
            hidden=int(config.hidden_size),
            intermediate=int(config.intermediate_size),
            layers=int(config.num_hidden_layers),
            kv_hidden=int(config.hidden_size) * int(kv_heads) // int(heads),
            vocab=int(config.vocab_size),
        )
    except (AttributeError, TypeError):
        return None


def decoder_flops(shape: Shape, tokens: int, pairs: int) -> float:
    """Forward FLOPs of all layers for `tokens` tokens whose attention spans `pairs`
    (query, key) pairs in all (4 x hidden multiply-adds a pair: q.k and p.v)."""
    per_layer = 2 * shape.layer_weights * tokens + 2 * 2 * shape.hidden * pairs
    return shape.layers * per_layer


def causal_pairs(prefix: int, tails: torch.Tensor) -> int:
    """(query, key) pairs of a causal model over a shared `prefix` and rows whose own
    tokens after it number `tails` (B,): the prefix's own triangle once, and every tail
    token sees the prefix and the tail tokens up to itself."""
    within_prefix = prefix * (prefix + 1) // 2
    return within_prefix + int((tails * prefix + tails * (tails + 1) // 2).sum())


@dataclass(frozen=True)
class PassSize:
    """What passes compute: FLOPs, tokens run (padding included where computed), real
    tokens (padding excluded) and LM-head rows. Passes add up with `+`."""

    flops: float = 0.0
    tokens: int = 0
    real_tokens: int = 0
    head_rows: int = 0

    def __add__(self, other: PassSize) -> PassSize:
        return PassSize(
            self.flops + other.flops,
            self.tokens + other.tokens,
            self.real_tokens + other.real_tokens,
            self.head_rows + other.head_rows,
        )

    def times(self, factor: int) -> PassSize:
        """The FLOPs `factor` times (x3: with the backward); the counts stay."""
        return replace(self, flops=self.flops * factor)


def decoder_pass(model: nn.Module, shape: Shape, batch: TrainBatch) -> PassSize:
    """The decoder FLOPs of `forward.hidden_at` on `batch` (no LM head), by the same
    `forward.forward_plan`: each shared prefix once, then each row's tail, padded (plain,
    shared cache), packed, or split into their parts (rows of several sequences)."""
    rows, width = batch.input_ids.shape
    plan = forward.forward_plan(model, batch)
    if plan.kind == "parts":  # every part of a row as a padded row of its own
        parts = split_parts(batch.input_ids, batch.attention_mask, batch.segment_ids)
        rows, width = parts.ids.shape
    if plan.kind in ("plain", "parts"):
        tails = torch.full((rows,), width)
        real = int(batch.attention_mask.sum())
        return PassSize(
            decoder_flops(shape, rows * width, causal_pairs(0, tails)), rows * width, real
        )
    own_tokens = [batch.attention_mask[c.rows, c.prefix :].sum(dim=1) for c in plan.clusters]
    pairs = zip(plan.clusters, own_tokens, strict=True)
    longest = max(c.prefix + int(own.sum()) for c, own in pairs)
    total = PassSize()
    for cluster, own in zip(plan.clusters, own_tokens, strict=True):
        prefix = cluster.prefix
        # packed: no padding but up to the longest packed sequence; a shared cache: every
        # tail padded to the widest row
        tails = own if plan.kind == "packed" else torch.full_like(own, width - prefix)
        run = longest if plan.kind == "packed" else prefix + int(tails.sum())
        flops = decoder_flops(shape, run, causal_pairs(prefix, tails))
        total = total + PassSize(flops, run, prefix + int(own.sum()))
    return total


def head_flops(shape: Shape, rows: int) -> float:
    """Forward FLOPs of the LM head (hidden x vocab) on `rows` hidden states."""
    return 2.0 * shape.hidden * shape.vocab * rows


def training_pass(
    model: nn.Module,
    batch: TrainBatch,
    head_rows: int | None = None,
    factor: int = WITH_BACKWARD,
) -> PassSize | None:
    """FLOPs of one forward of `model` on `batch` as `forward.hidden_at` runs it, times
    `factor` (1: forward only; WITH_BACKWARD, or WITH_FROZEN_BACKWARD for LoRA); None for
    a model whose shape is unknown.

    LM-head rows: `head_rows` (SFT: its agent tokens), or by default those of
    `forward.policy_logprobs`: every row at every position that predicts an agent token
    somewhere in the batch.
    """
    shape = model_shape(model)
    if shape is None:
        return None
    size = decoder_pass(model, shape, batch)
    if head_rows is None:
        head_rows = len(batch) * len(forward.trained_positions(batch))
    with_head = replace(size, flops=size.flops + head_flops(shape, head_rows), head_rows=head_rows)
    return with_head.times(factor)


def detached_context_pass(
    model: nn.Module, batch: TrainBatch, factor: int = WITH_BACKWARD
) -> PassSize | None:
    """FLOPs of `policy_logprobs` with `detach_context` (see `compute.detached_context`):
    every token once forward only (a shared prompt once, the tails padded), then the
    positions that predict agent tokens forward and `factor` x, attending to all T + K
    keys, with their LM-head rows; None for a model whose shape is unknown."""
    shape = model_shape(model)
    if shape is None:
        return None
    rows, width = batch.input_ids.shape
    read = rows * len(forward.trained_positions(batch))
    prefix = forward.cached_prefix_length(batch)
    context_tokens = prefix + rows * (width - prefix)
    tails = torch.full((rows,), width - prefix)
    context = decoder_flops(shape, context_tokens, causal_pairs(prefix, tails))
    reads = decoder_flops(shape, read, read * (width + read // rows)) + head_flops(shape, read)
    real = int(batch.attention_mask.sum())
    return PassSize(context + reads * factor, context_tokens + read, real, read)


def critic_pass(
    backbone: nn.Module, batch: TrainBatch, factor: int = WITH_BACKWARD
) -> PassSize | None:
    """FLOPs of a critic's forward (`ValueModel`: its backbone as `forward.hidden_at` runs
    it; the 1-wide value head is negligible), times `factor`."""
    shape = model_shape(backbone)
    if shape is None:
        return None
    return decoder_pass(backbone, shape, batch).times(factor)


# ------------------------------------------------------------------------- peak


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_peak(dtype: torch.dtype = torch.float32, device: str = "cpu") -> float:
    """Best GFLOP/s of a square matmul in `dtype` on `device`, measured now: the size
    doubles from 256 until a product takes >= 50 ms (or reaches 2048 on a CPU, 8192 on a
    GPU), then the best of 5 products of that size. On a CPU without native bf16, bf16
    stops small (a 2048^3 product there takes ~30 s): its figure then says how slow that
    dtype is there, it does not flatter anything.

    The operands come from a generator of its own: the global RNG a run seeded must not
    depend on whether this process measured the peak already (nor on how many sizes the
    machine's speed made it try)."""
    where = torch.device(device)
    largest = 8192 if where.type == "cuda" else 2048
    operands = torch.Generator(device=where).manual_seed(0)
    size = 256
    while True:
        a = torch.randn(size, size, dtype=dtype, device=where, generator=operands)
        b = torch.randn(size, size, dtype=dtype, device=where, generator=operands)
        a @ b  # warm-up (kernel choice, allocation)
        _synchronize(where)
        started = time.perf_counter()
        a @ b
        _synchronize(where)
        if time.perf_counter() - started >= 0.05 or size >= largest:
            break
        size *= 2
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        a @ b
        _synchronize(where)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best / 1e9


#: `measure_matmul_peak` once per process and (dtype, device): a run's figures share it.
matmul_peak = functools.cache(measure_matmul_peak)


def peak_of(model: nn.Module, precision: Precision) -> tuple[float, torch.dtype]:
    """(`matmul_peak` GFLOP/s, dtype) for the dtype `model`'s passes compute in: the
    autocast dtype under mixed precision, else its weights' own; on its weights' device."""
    param = next(model.parameters())
    dtype = precision.compute_dtype if precision.mixed else param.dtype
    return matmul_peak(dtype, str(param.device)), dtype


def utilisation(flops: float, seconds: float, peak_gflops: float) -> dict[str, float]:
    """Achieved GFLOP/s and its share of the peak, as `perf/` metrics (empty without time)."""
    if seconds <= 0 or flops <= 0:
        return {}
    achieved = flops / seconds / 1e9
    return {"gflops": achieved, "peak_share": achieved / peak_gflops if peak_gflops else 0.0}
