"""Training-time forward passes: token log-probs and entropy of the actor, values of the
critic, log-probs of the reference policy. All outputs are (B, T), aligned to tokens."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from starpo.algorithms import entropy_from_logits, head_logprobs, token_logprobs
from starpo.models.compat import cache_argument, uses_sliding_window
from starpo.trainer.batch import TrainBatch

#: Shortest common prefix worth encoding once for the whole micro-batch.
MIN_SHARED_PREFIX = 16
#: Model types whose logits are exactly `lm_head(final hidden state)`: no bias, logit
#: scaling or soft-capping, so `head_logprobs` may compute the log-probs from hidden states.
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def gather_rows(states: torch.Tensor, index: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """`states` at `index` (any shape) along `dim`, e.g. (L, H) at (B, K) -> (B, K, H).

    `index_select`, not advanced indexing: when an index repeats (every row reads the
    shared prompt's last token), advanced indexing's backward sums the repeats with atomic
    adds that race across CPU threads, so gradients changed in their last bits from run
    to run and identical runs drifted apart; `index_select`'s backward adds them in order.
    """
    picked = states.index_select(dim, index.reshape(-1))
    return picked.unflatten(dim, index.shape)


def shared_prefix_length(batch: TrainBatch) -> int:
    """Tokens at the start that every row has in common (all rollouts of a group begin with
    the same prompt), capped so every row keeps at least one token after it."""
    ids = batch.input_ids
    differs = torch.nonzero(~(ids == ids[:1]).all(dim=0))
    prefix = int(differs[0]) if len(differs) else ids.shape[1]
    return min(prefix, int(batch.attention_mask.sum(dim=1).min()) - 1)


def plain_head_weight(model: nn.Module) -> torch.Tensor | None:
    """The output embedding (V, H) of a model whose logits are hidden @ W^T and nothing
    else (see PLAIN_HEAD_MODEL_TYPES); None for any other model (also for a LoRA-wrapped
    or hooked head), which then goes through its own forward and full logits."""
    if getattr(getattr(model, "config", None), "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear or head.bias is not None or _hooked(head):
        return None
    return head.weight


def _hooked(module: nn.Module) -> bool:
    """Whether forward hooks watch `module`: the hidden-state path never calls it, so a
    hooked LM head (instrumentation, tests) runs as a module instead."""
    from torch.nn.modules import module as torch_module

    hooks = (module._forward_hooks, module._forward_pre_hooks)
    global_hooks = (torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks)
    return any(hooks) or any(global_hooks)


class _TiedEmbedding(torch.autograd.Function):
    """`F.embedding(ids, weight, padding_idx)` for an embedding matrix that is also the LM
    head's. Backward adds the rows of these tokens in place to the weight gradient the head
    has just produced (`grad_sink`, see `head_logprobs`), instead of materialising a dense
    (vocab, hidden) gradient that autograd would then add to the head's with a full copy."""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx, grad_sink):
        ctx.save_for_backward(ids)
        ctx.padding_idx, ctx.grad_sink, ctx.shape = padding_idx, grad_sink, weight.shape
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        ids, rows = ids.reshape(-1), grad.reshape(ids.numel(), -1)
        if ctx.padding_idx is not None:  # the padding row gets no gradient
            keep = ids != ctx.padding_idx
            ids, rows = ids[keep], rows[keep]
        if ctx.grad_sink:  # the head's gradient, not yet accumulated: add to it
            target = ctx.grad_sink.pop()
            target.index_add_(0, ids, rows.to(target.dtype))
            return None, None, None, None
        dense = torch.zeros(ctx.shape, dtype=grad.dtype, device=grad.device)
        return None, dense.index_add_(0, ids, rows), None, None


def _embed(model: nn.Module, ids: torch.Tensor, grad_sink: list | None) -> torch.Tensor:
    """Input embeddings of `ids`, as the model's own embedding layer computes them; with a
    `grad_sink` (tied weights, see `_tied_grad_sink`) through `_TiedEmbedding`."""
    embed = model.get_input_embeddings()
    if grad_sink is None:
        return embed(ids)
    return _TiedEmbedding.apply(ids, embed.weight, embed.padding_idx, grad_sink)


def _tied_grad_sink(model: nn.Module, weight: torch.Tensor) -> list | None:
    """A fresh list through which the LM head passes its weight gradient to the embedding
    lookup, when the embedding is a plain `nn.Embedding` on the head's own weight and that
    weight trains; None otherwise (the embedding then runs as the model's own)."""
    embed = model.get_input_embeddings()
    plain = (
        type(embed) is nn.Embedding
        and embed.max_norm is None
        and not embed.scale_grad_by_freq
        and not embed.sparse
    )
    trains = torch.is_grad_enabled() and weight.requires_grad
    return [] if plain and trains and embed.weight is weight else None


def _share_cache(cache, rows: int, device: torch.device) -> None:
    """Give all `rows` the prefix's KV cache (computed for one row), differentiably.

    Broadcast views (`expand`), not copies: each layer's cache update concatenates them with
    the rows' own keys anyway, and the backward of a view sums the rows' gradients in one
    reduction (an index copy's backward scatters them one by one). A cache without plain
    per-layer key and value tensors falls back to the cache's own row selection.
    """
    layers = getattr(cache, "layers", None) or []
    plain = all(
        isinstance(getattr(layer, "keys", None), torch.Tensor)
        and isinstance(getattr(layer, "values", None), torch.Tensor)
        for layer in layers
    )
    if not layers or not plain:
        cache.batch_select_indices(torch.zeros(rows, dtype=torch.long, device=device))
        return
    for layer in layers:
        layer.keys = layer.keys.expand(rows, *layer.keys.shape[1:])
        layer.values = layer.values.expand(rows, *layer.values.shape[1:])


def _shared_prefix_pass(
    batch: TrainBatch,
    positions: torch.Tensor,
    prefix: int,
    run: Callable[..., tuple[torch.Tensor, object]],
) -> torch.Tensor:
    """Outputs (B, K, D) at `positions`, the first `prefix` tokens encoded once.

    `run(part, keep, **kwargs)` runs the model on the "prefix" (row 0's first `prefix`
    tokens) or the "tail" (every row's tokens after it) and returns (its outputs at indices
    `keep` of that part, its KV cache). Exact: the prefix's KV cache is shared with every
    row differentiably, so gradients through the prompt add up over the rows as in a full
    forward pass, at a fraction of the compute when the prompt is long.
    """
    rows, length = batch.input_ids.shape
    early, late = positions[positions < prefix], positions[positions >= prefix]
    head, cache = run("prefix", early, use_cache=True)
    _share_cache(cache, rows, positions.device)
    tail, _ = run(
        "tail",
        late - prefix,
        attention_mask=batch.attention_mask,
        position_ids=torch.arange(prefix, length, device=positions.device).expand(rows, -1),
        cache=cache,
    )
    if not len(early):
        return tail
    return torch.cat([head.expand(rows, -1, -1), tail], dim=1)


def logits_at(model: nn.Module, batch: TrainBatch, positions: torch.Tensor) -> torch.Tensor:
    """Logits (B, K, V) at sequence `positions` from the model's own forward, encoding a
    shared prompt prefix only once (`_shared_prefix_pass`)."""
    prefix = shared_prefix_length(batch)
    if len(batch) == 1 or prefix < MIN_SHARED_PREFIX:
        out = model(  # no KV cache: nothing reads it, it would only hold memory until backward
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            logits_to_keep=positions,
            use_cache=False,
        )
        return out.logits
    name = cache_argument(model)
    ids = {"prefix": batch.input_ids[:1, :prefix], "tail": batch.input_ids[:, prefix:]}

    def run(part, keep, cache=None, **kwargs):
        if cache is not None:
            kwargs[name] = cache
        # At least one logit row: an empty `logits_to_keep` would mean "all of them".
        out = model(input_ids=ids[part], logits_to_keep=keep if len(keep) else 1, **kwargs)
        return (out.logits if len(keep) else out.logits[:, :0]), out.get(name)

    return _shared_prefix_pass(batch, positions, prefix, run)


def hidden_at(
    model: nn.Module, batch: TrainBatch, positions: torch.Tensor, grad_sink: list | None = None
) -> torch.Tensor:
    """Final hidden states (B, K, H) at sequence `positions` (what the LM head reads),
    encoding a shared prompt prefix only once; the decoder runs without the LM head.
    `grad_sink`: see `_tied_grad_sink`."""
    decoder = model.get_decoder()
    plan = forward_plan(model, batch)
    if plan.kind == "plain":
        out = decoder(
            inputs_embeds=_embed(model, batch.input_ids, grad_sink),
            attention_mask=batch.attention_mask,
            use_cache=False,
        )
        return gather_rows(out.last_hidden_state, positions, dim=1)
    if plan.kind == "packed":
        return _packed_hidden_at(model, batch, positions, plan.clusters, grad_sink)
    prefix = plan.clusters[0].prefix
    # One embedding lookup for the prefix and every row's tail: one gradient for it.
    name = cache_argument(decoder)
    ids = batch.input_ids
    rows, length = ids.shape
    embeds = _embed(model, torch.cat([ids[0, :prefix], ids[:, prefix:].reshape(-1)]), grad_sink)
    parts = {
        "prefix": embeds[:prefix].unsqueeze(0),
        "tail": embeds[prefix:].view(rows, length - prefix, -1),
    }

    def run(part, keep, cache=None, **kwargs):
        if cache is not None:
            kwargs[name] = cache
        out = decoder(inputs_embeds=parts[part], **kwargs)
        return gather_rows(out.last_hidden_state, keep, dim=1), out.get(name)

    return _shared_prefix_pass(batch, positions, prefix, run)


# ------------------------------------------------------------------ packed rows

#: Attention implementations that take a custom 4D mask (sdpa: boolean, eager: additive).
PACKABLE_ATTENTION = ("sdpa", "eager")
#: "auto": pack a shared-prompt micro-batch when `packing_cost` says it is cheaper than
#: sharing a KV cache; "always" or "never" force one path (tests, benchmarks).
PACKING = "auto"
#: What one row's copy of one cached position costs, in tokens' worth of layer compute:
#: the shared KV cache path copies the prefix's keys and values to every row (and their
#: GQA head repeats) and sums their gradients back. Measured on a 2-core CPU with
#: SmolLM2-135M: 0.44 s a micro-batch of 8 rows x 208 positions, where a token costs 4 ms.
ROW_COPY_TOKENS = 0.064


@dataclass(frozen=True)
class PromptCluster:
    """Rows of a batch that share a prompt, and the tokens they share at the start."""

    rows: torch.Tensor  # (n,) batch rows
    prefix: int  # tokens all of them share, capped so each keeps at least one of its own


def prompt_clusters(batch: TrainBatch) -> list[PromptCluster]:
    """The batch's rows grouped by their prompt (the tokens before their first agent token;
    a row without one counts whole), in order of first appearance. Different env groups
    can share a prompt (the bandit's 16 groups have 4 prompts between them), so a
    micro-batch of several groups encodes each prompt once (`_packed_hidden_at`)."""
    ids, agent = batch.input_ids.cpu(), batch.loss_mask.cpu() > 0
    lengths = batch.attention_mask.sum(dim=1).cpu()
    first = torch.where(agent.any(dim=1), agent.int().argmax(dim=1), lengths)
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for row in range(len(ids)):
        by_prompt.setdefault(tuple(ids[row, : first[row]].tolist()), []).append(row)
    clusters = []
    for rows in by_prompt.values():
        index = torch.tensor(rows)
        same = (ids[index] == ids[index[:1]]).all(dim=0)
        differs = torch.nonzero(~same)
        prefix = int(differs[0]) if len(differs) else ids.shape[1]
        prefix = min(prefix, int(lengths[index].min()) - 1)
        clusters.append(PromptCluster(index.to(batch.input_ids.device), prefix))
    return clusters


@dataclass(frozen=True)
class PackedRows:
    """Rows as C packed sequences, one per `PromptCluster`: its prefix once, then each of
    its rows' own tokens (padding dropped), right-padded to the longest sequence. Entry
    [c, i] of each (C, L) tensor describes token i of sequence c; (B,) tensors index the
    flattened (C * L) tokens."""

    ids: torch.Tensor  # (C, L) token ids
    positions: torch.Tensor  # (C, L) position of the token in its own row
    segments: torch.Tensor  # (C, L) -1 on a prefix, -2 on padding, else the token's row
    starts: torch.Tensor  # (B,) flat index of each row's first own token
    prefix_starts: torch.Tensor  # (B,) flat index of the first token of each row's prefix
    prefixes: torch.Tensor  # (B,) prefix length of each row's cluster


def _pack_cluster(batch: TrainBatch, cluster: PromptCluster) -> tuple[torch.Tensor, ...]:
    """(ids, positions, segments, own tokens per row) of one cluster's packed sequence."""
    ids, mask = batch.input_ids[cluster.rows], batch.attention_mask[cluster.rows]
    prefix = cluster.prefix
    keep = mask.bool().clone()
    keep[:, :prefix] = False
    columns = torch.arange(ids.shape[1], device=ids.device)
    own = mask.sum(dim=1) - prefix  # (n,) tokens after the prefix, >= 1
    return (
        torch.cat([ids[0, :prefix], ids[keep]]),
        torch.cat([columns[:prefix], columns.expand_as(keep)[keep]]),
        torch.cat(
            [torch.full((prefix,), -1, device=ids.device), cluster.rows.repeat_interleave(own)]
        ),
        own,
    )


def pack_rows(batch: TrainBatch, clusters: list[PromptCluster]) -> PackedRows:
    """Each cluster's prefix once, then every one of its rows' tokens after it."""
    parts = [_pack_cluster(batch, cluster) for cluster in clusters]
    width = max(len(part[0]) for part in parts)
    rows, device = len(batch), batch.input_ids.device
    starts = torch.zeros(rows, dtype=torch.long, device=device)
    prefix_starts, prefixes = torch.zeros_like(starts), torch.zeros_like(starts)
    for c, (cluster, (_, _, _, own)) in enumerate(zip(clusters, parts, strict=True)):
        base = c * width
        starts[cluster.rows] = base + cluster.prefix + torch.cumsum(own, dim=0) - own
        prefix_starts[cluster.rows] = base
        prefixes[cluster.rows] = cluster.prefix

    def padded(index: int, fill: int) -> torch.Tensor:
        return torch.stack(
            [F.pad(part[index], (0, width - len(part[index])), value=fill) for part in parts]
        )

    return PackedRows(
        ids=padded(0, int(batch.input_ids[0, 0])),
        positions=padded(1, 0),
        segments=padded(2, -2),
        starts=starts,
        prefix_starts=prefix_starts,
        prefixes=prefixes,
    )


def packed_attention_mask(packed: PackedRows, kind: str, dtype: torch.dtype) -> torch.Tensor:
    """(C, 1, L, L) mask: a token sees its sequence's prefix and the earlier tokens of its
    own row, as it would in its own padded row (a padding token sees the prefix and earlier
    padding, so no softmax is empty). Boolean (True = attend) for sdpa, additive for
    eager attention."""
    seg = packed.segments
    index = torch.arange(seg.shape[1], device=seg.device)
    same_row = (seg.unsqueeze(2) == seg.unsqueeze(1)) | (seg.unsqueeze(1) == -1)
    allowed = same_row & (index.unsqueeze(0) <= index.unsqueeze(1))  # (C, L, L) query x key
    if kind == "sdpa":
        return allowed[:, None]
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
    return blocked.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def packed_index(packed: PackedRows, batch: TrainBatch, positions: torch.Tensor) -> torch.Tensor:
    """(B, K) flat packed index of each row's token at each of `positions` (its prefix's
    for a position inside it; the row's last token for a padding position, which no loss
    reads)."""
    last = batch.attention_mask.sum(dim=1, keepdim=True) - 1  # (B, 1)
    pos = torch.minimum(positions.unsqueeze(0), last)  # (B, K)
    prefix = packed.prefixes.unsqueeze(1)
    inside = packed.prefix_starts.unsqueeze(1) + pos
    own = packed.starts.unsqueeze(1) + pos - prefix
    return torch.where(pos < prefix, inside, own)


def _pair_cost(config) -> float:
    """What one (query, key) pair costs in tokens' worth of layer compute: 4 hidden
    multiply-adds per layer where a token costs the layer's weights, at about half the
    efficiency: 4 x hidden / weights."""
    hidden, inter = config.hidden_size, config.intermediate_size
    kv = hidden * config.num_key_value_heads // config.num_attention_heads
    return 4 * hidden / (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter)


def packing_cost(config, batch: TrainBatch, prefix: int) -> tuple[float, float]:
    """(packed, shared cache) costs of a shared-prefix micro-batch, in tokens' worth of
    layer compute (forward + backward).

    Packed: the prefix and every row's own tokens once (no padding), attention over all
    L x L pairs of the packed sequence (a custom mask skips nothing). Shared cache: the
    prefix once, every row's tail padded to the widest, attention over the pairs a
    causal model needs, plus ROW_COPY_TOKENS for every row's copy of every cached position.
    """
    rows, width = batch.input_ids.shape
    pair = _pair_cost(config)
    tail = width - prefix
    packed_tokens = prefix + int(batch.attention_mask[:, prefix:].sum())
    packed = packed_tokens + pair * packed_tokens**2
    cached_pairs = prefix * prefix / 2 + rows * tail * width
    cached = prefix + rows * tail + pair * cached_pairs + ROW_COPY_TOKENS * rows * width
    return packed, cached


def clusters_cost(config, batch: TrainBatch, clusters: list[PromptCluster]) -> float:
    """Cost (as `packing_cost`) of one packed sequence per cluster, padded to the longest,
    attention over all pairs of each."""
    width = max(c.prefix + int(batch.attention_mask[c.rows, c.prefix :].sum()) for c in clusters)
    return len(clusters) * (width + _pair_cost(config) * width**2)


def plain_cost(config, batch: TrainBatch) -> float:
    """Cost (as `packing_cost`) of the padded rows as they are, all pairs of each."""
    rows, width = batch.input_ids.shape
    return rows * (width + _pair_cost(config) * width**2)


def _packable(config) -> bool:
    """The model takes a custom attention mask and has no sliding window (which the mask
    would drop)."""
    return config._attn_implementation in PACKABLE_ATTENTION and not uses_sliding_window(config)


def packing_pays(model: nn.Module, batch: TrainBatch, prefix: int) -> bool:
    """Whether to run a shared-prefix micro-batch packed (`_packed_hidden_at`) rather than
    through a shared KV cache: the model is `_packable`, and `packing_cost` finds packing
    cheaper (PACKING "auto"). Short answers to a long prompt pack (the bandit); long ones
    do not."""
    if PACKING == "never" or not _packable(model.config):
        return False
    if PACKING == "always":
        return True
    packed, cached = packing_cost(model.config, batch, prefix)
    return packed < cached


@dataclass(frozen=True)
class ForwardPlan:
    """How `hidden_at` runs a batch: "plain" (the padded rows), "cache" (the first
    cluster's prefix once, shared with every row as a KV cache) or "packed" (one packed
    sequence per cluster). `flops.decoder_pass` counts the same plan."""

    kind: str
    clusters: list[PromptCluster]


def forward_plan(model: nn.Module, batch: TrainBatch) -> ForwardPlan:
    """The cheapest exact way to run `batch`: rows with several prompts, some shared by
    several rows (groups of one prompt in one micro-batch), pack one sequence per prompt
    when `clusters_cost` beats the alternatives; rows with one common prefix share it
    packed or through a KV cache (`packing_pays`); other batches run plain."""
    rows, config = len(batch), model.config
    prefix = shared_prefix_length(batch)
    if rows > 1 and PACKING != "never" and _packable(config):
        clusters = prompt_clusters(batch)
        if 1 < len(clusters) < rows:
            others = [plain_cost(config, batch)]
            if prefix >= MIN_SHARED_PREFIX:
                others += packing_cost(config, batch, prefix)
            if PACKING == "always" or clusters_cost(config, batch, clusters) < min(others):
                return ForwardPlan("packed", clusters)
    if rows == 1 or prefix < MIN_SHARED_PREFIX:
        return ForwardPlan("plain", [])
    every = [PromptCluster(torch.arange(rows, device=batch.input_ids.device), prefix)]
    return ForwardPlan("packed" if packing_pays(model, batch, prefix) else "cache", every)


def _packed_hidden_at(
    model: nn.Module,
    batch: TrainBatch,
    positions: torch.Tensor,
    clusters: list[PromptCluster],
    grad_sink: list | None,
) -> torch.Tensor:
    """`hidden_at` for rows in `clusters`, as one packed sequence per cluster
    (`pack_rows`): exact, as every token attends to what it would see in its own row, at
    its own position."""
    packed = pack_rows(batch, clusters)
    sequences, width = packed.ids.shape
    embeds = _embed(model, packed.ids.reshape(-1), grad_sink).view(sequences, width, -1)
    mask = packed_attention_mask(packed, model.config._attn_implementation, embeds.dtype)
    out = model.get_decoder()(
        inputs_embeds=embeds,
        attention_mask=mask,
        position_ids=packed.positions,
        use_cache=False,
    )
    hidden = out.last_hidden_state.flatten(0, 1)  # (C * L, H)
    return gather_rows(hidden, packed_index(packed, batch, positions))


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype a linear layer on `weight` computes in here: autocast's, else weight's."""
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


def policy_logprobs(
    model: nn.Module, batch: TrainBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of every agent token under `model` at `temperature`.

    Only positions that predict an agent token somewhere in the batch reach the LM head,
    which saves most of the (B, T, vocab) logits on long prompts, and a prompt shared by all
    rows is encoded once. With a plain LM head (`plain_head_weight`) the log-probs come
    from the hidden states through `head_logprobs`, which never holds (B, K, vocab) logits
    nor their softmax; other models go through their own forward and full logits.
    """
    targets = torch.nonzero(batch.loss_mask.any(dim=0)).squeeze(1)  # (K,) token positions
    targets = targets[targets > 0]  # token 0 has no prediction
    labels = batch.input_ids[:, targets]  # (B, K)
    temperature = max(temperature, 1e-6)
    weight = plain_head_weight(model)
    if weight is not None:
        sink = _tied_grad_sink(model, weight)
        hidden = hidden_at(model, batch, targets - 1, sink)  # (B, K, H)
        picked, entropy_k = head_logprobs(
            hidden.flatten(0, 1),
            weight,
            labels.flatten(),
            temperature,
            with_entropy,
            dtype=_compute_dtype(weight),
            grad_sink=sink,
        )
        picked = picked.view(labels.shape)
        entropy_k = entropy_k.view(labels.shape) if entropy_k is not None else None
    else:
        logits = logits_at(model, batch, targets - 1).float() / temperature  # (B, K, V)
        picked = token_logprobs(logits, labels)
        entropy_k = entropy_from_logits(logits) if with_entropy else None
    logprobs = torch.zeros_like(batch.loss_mask).index_copy(1, targets, picked)
    if entropy_k is None:
        return logprobs * batch.loss_mask, None
    entropy = torch.zeros_like(batch.loss_mask).index_copy(1, targets, entropy_k)
    return logprobs * batch.loss_mask, entropy * batch.loss_mask


def reference_logprobs(
    actor: nn.Module, reference: nn.Module | None, batch: TrainBatch, temperature: float
) -> torch.Tensor:
    """Log-probs under the reference policy: a frozen copy, or the LoRA actor with its
    adapters switched off (the base weights are the reference)."""
    disabled = contextlib.nullcontext() if reference is not None else actor.disable_adapter()
    model = reference if reference is not None else actor
    with torch.no_grad(), disabled:
        logprobs, _ = policy_logprobs(model, batch, temperature, with_entropy=False)
    return logprobs
