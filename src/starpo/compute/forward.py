"""Training-time forward passes: token log-probs and entropy of the actor, log-probs of
the reference policy, the final hidden states or logits at chosen positions (`starpo sft`
scores its agent tokens with them). All outputs are aligned to tokens.

A prompt that rows share is encoded once: through a KV cache shared with every row, or
packed into one sequence with them (`packing`); `forward_plan` picks the cheaper exact
way, by the settings below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from starpo.algorithms import entropy_from_logits, head_logprobs, token_logprobs
from starpo.compute.batch import TrainBatch
from starpo.compute.detached_context import check_detachable, hidden_at_read_positions
from starpo.compute.packing import (
    PromptCluster,
    clusters_cost,
    pack_rows,
    packable,
    packed_attention_mask,
    packed_index,
    packing_cost,
    plain_cost,
    prompt_clusters,
)
from starpo.compute.prefix_cache import context_cache, share_cache
from starpo.compute.segments import split_parts
from starpo.models.compat import cache_argument

#: Shortest common prefix worth encoding once for the whole micro-batch.
MIN_SHARED_PREFIX = 16
#: "auto": pack a shared-prompt micro-batch when `packing_cost` says it is cheaper than
#: sharing a KV cache; "always" or "never" force one path (tests, benchmarks).
PACKING = "auto"
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


def common_prefix_length(ids: torch.Tensor, lengths: torch.Tensor) -> int:
    """Tokens at the start of the right-padded rows `ids` (B, T) that every row has in
    common, capped so every row keeps at least one of its `lengths` (B,) tokens after it."""
    differs = torch.nonzero(~(ids == ids[:1]).all(dim=0))
    prefix = int(differs[0]) if len(differs) else ids.shape[1]
    return min(prefix, int(lengths.min()) - 1)


def shared_prefix_length(batch: TrainBatch) -> int:
    """Tokens at the start that every row has in common (all rollouts of a group begin with
    the same prompt), capped so every row keeps at least one token after it."""
    return common_prefix_length(batch.input_ids, batch.attention_mask.sum(dim=1))


def cached_prefix_length(batch: TrainBatch) -> int:
    """The shared prompt a forward encodes once and gives every row through a KV cache:
    `shared_prefix_length`, or 0 for a single row or a prefix too short to pay for it
    (`MIN_SHARED_PREFIX`)."""
    prefix = shared_prefix_length(batch)
    return prefix if len(batch) > 1 and prefix >= MIN_SHARED_PREFIX else 0


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
    share_cache(cache, rows, positions.device)
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
    if batch.segment_ids is not None:  # each part a row of its own (`segments`)
        parts = split_parts(batch.input_ids, batch.attention_mask, batch.segment_ids)
        keep, index = parts.read_at(positions)  # logits only where read, as the plain path
        inputs = {"input_ids": parts.ids, "attention_mask": parts.attention_mask}
        out = model(**inputs, logits_to_keep=keep, use_cache=False)
        return gather_rows(out.logits.flatten(0, 1), index)
    prefix = cached_prefix_length(batch)
    if not prefix:
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
    if plan.kind == "parts":  # each part a row of its own (`segments`)
        parts = split_parts(batch.input_ids, batch.attention_mask, batch.segment_ids)
        embeds = _embed(model, parts.ids, grad_sink)
        out = decoder(inputs_embeds=embeds, attention_mask=parts.attention_mask, use_cache=False)
        return gather_rows(out.last_hidden_state.flatten(0, 1), parts.index[:, positions])
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


# ------------------------------------------------------------------ the plan


def packing_pays(model: nn.Module, batch: TrainBatch, prefix: int) -> bool:
    """Whether to run a shared-prefix micro-batch packed (`_packed_hidden_at`) rather than
    through a shared KV cache: the model is `packable`, and `packing_cost` finds packing
    cheaper (PACKING "auto"). Short answers to a long prompt pack (the bandit); long ones
    do not."""
    if PACKING == "never" or not packable(model.config):
        return False
    if PACKING == "always":
        return True
    packed, cached = packing_cost(model.config, batch, prefix)
    return packed < cached


@dataclass(frozen=True)
class ForwardPlan:
    """How `hidden_at` runs a batch: "plain" (the padded rows), "cache" (the first
    cluster's prefix once, shared with every row as a KV cache), "packed" (one packed
    sequence per cluster) or "parts" (rows of several sequences: each part a row of its
    own, `segments.split_parts`). `flops.decoder_pass` counts the same plan."""

    kind: str
    clusters: list[PromptCluster]


def forward_plan(model: nn.Module, batch: TrainBatch) -> ForwardPlan:
    """The cheapest exact way to run `batch`: rows with several prompts, some shared by
    several rows (groups of one prompt in one micro-batch), pack one sequence per prompt
    when `clusters_cost` beats the alternatives; rows with one common prefix share it
    packed or through a KV cache (`packing_pays`); other batches run plain."""
    rows, config = len(batch), model.config
    if batch.segment_ids is not None:  # rows of several sequences: one row per part
        return ForwardPlan("parts", [])
    prefix = shared_prefix_length(batch)
    if rows > 1 and PACKING != "never" and packable(config):
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


def trained_positions(batch: TrainBatch) -> torch.Tensor:
    """(K,) the positions of the tokens some row of `batch` trains on, token 0 left out
    (nothing comes before it): where the update reads the policy's log-probs and the
    critic's values, each from the hidden state one position earlier."""
    targets = torch.nonzero(batch.loss_mask.any(dim=0)).squeeze(1)
    return targets[targets > 0]


def policy_logprobs(
    model: nn.Module,
    batch: TrainBatch,
    temperature: float,
    with_entropy: bool = True,
    detach_context: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of every agent token under `model` at `temperature`.

    Only positions that predict an agent token somewhere in the batch reach the LM head,
    which saves most of the (B, T, vocab) logits on long prompts, and a prompt shared by all
    rows is encoded once. With a plain LM head (`plain_head_weight`) the log-probs come
    from the hidden states through `head_logprobs`, which never holds (B, K, vocab) logits
    nor their softmax; other models go through their own forward and full logits.

    `detach_context` (approximate, `optim.detach_context`): while autograd records, the
    gradient flows only through the positions that predict agent tokens
    (`detached_context`); the values returned are the same.
    """
    detach_context = detach_context and torch.is_grad_enabled()
    targets = trained_positions(batch)  # (K,)
    labels = batch.input_ids[:, targets]  # (B, K)
    temperature = max(temperature, 1e-6)
    weight = plain_head_weight(model)
    if detach_context:
        check_detachable(model, batch, weight, PLAIN_HEAD_MODEL_TYPES)
    if weight is not None:
        sink = _tied_grad_sink(model, weight)
        if detach_context:
            cache = context_cache(model.get_decoder(), batch, cached_prefix_length(batch))
            hidden = hidden_at_read_positions(
                model, batch, targets - 1, lambda ids: _embed(model, ids, sink), cache
            )
        else:
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
