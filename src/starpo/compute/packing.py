"""Rows that share a prompt, run as one packed sequence: the prompt once, then each row's
own tokens, with a mask that lets every token see what it would see in its own padded row.
Also the cost model (`packing_cost`, `clusters_cost`, `plain_cost`) by which
`forward.forward_plan` picks packing, a shared KV cache or the plain padded rows.

All (B, T) inputs are a `TrainBatch`'s; (C, L) tensors are C packed sequences of L tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from starpo.compute.batch import TrainBatch
from starpo.models.compat import uses_sliding_window

#: Attention implementations that take a custom 4D mask (sdpa: boolean, eager: additive).
PACKABLE_ATTENTION = ("sdpa", "eager")
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
    micro-batch of several groups encodes each prompt once (`forward.hidden_at`)."""
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
    return sequences_cost(config, len(clusters), width)


def plain_cost(config, batch: TrainBatch) -> float:
    """Cost (as `packing_cost`) of the padded rows as they are, all pairs of each."""
    rows, width = batch.input_ids.shape
    return sequences_cost(config, rows, width)


def sequences_cost(config, sequences: int, width: int) -> float:
    """Cost (as `packing_cost`) of `sequences` sequences of `width` tokens, all pairs of each."""
    return sequences * (width + _pair_cost(config) * width**2)


def groups_packing_pays(config, groups: int, rows: int, length: int, prompt: int) -> bool:
    """Whether `rows` rows of `length` tokens from `groups` prompts of `prompt` tokens (rows
    sorted by prompt) pack for less than they cost as they are: `clusters_cost` against
    `plain_cost` for a batch of that shape, asked by the memory plan before any batch exists."""
    if not packable(config) or groups < 2 or groups >= rows:
        return False
    width = prompt + -(-rows // groups) * (length - prompt)
    return sequences_cost(config, groups, width) < sequences_cost(config, rows, length)


def packable(config) -> bool:
    """The model takes a custom attention mask and has no sliding window (which the mask
    would drop)."""
    return config._attn_implementation in PACKABLE_ATTENTION and not uses_sliding_window(config)
