"""Rows that hold several sequences: a trajectory whose context window dropped turns
(`EpisodeSettings.context_window`) saw a fresh prompt at each `Trajectory.context_resets`
offset, so each part is trained as the sequence the policy saw. The forward runs every
part as a row of its own (`split_parts`), with plain causal attention: no (T, T) mask, whose
attention weights a CPU's sdpa would keep per layer for backward (a 10-turn Sokoban
micro-batch ran out of 24 GiB that way), and reads the outputs back at the trajectory
rows' positions (`Parts.index`). (B, T) tensors are a `TrainBatch`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def segment_ids(resets: list[list[int]], width: int) -> torch.Tensor | None:
    """(B, T) index of the part each token belongs to (padding counts as the last part),
    from each row's reset offsets; None when no row has a reset (one sequence each)."""
    if not any(resets):
        return None
    columns = torch.arange(width)
    out = torch.zeros(len(resets), width, dtype=torch.long)
    for row, offsets in enumerate(resets):
        for offset in offsets:
            out[row] += (columns >= offset).long()
    return out


@dataclass(frozen=True)
class Parts:
    """Every part of every row as a row of its own, right-padded: (P, L) tensors, and
    `index` (B, T): where each token of the batch's rows sits in the flattened (P * L)
    parts (a padding token: its row's last real token, which no loss reads)."""

    ids: torch.Tensor  # (P, L)
    attention_mask: torch.Tensor  # (P, L)
    index: torch.Tensor  # (B, T) flat index into (P * L)

    def read_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the parts' own columns that the rows' `positions` read, sorted: a forward's
        `logits_to_keep`; (B, K) where each row's position lands in the (P * kept) outputs
        of a forward that kept only those columns)."""
        width = self.ids.shape[1]
        flat = self.index[:, positions]  # (B, K) into the flattened (P * L) parts
        keep = torch.unique(flat % width)
        return keep, (flat // width) * len(keep) + torch.searchsorted(keep, flat % width)


def split_parts(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, segments: torch.Tensor
) -> Parts:
    """The rows' parts (see `Parts`), in row order, each part's tokens in order."""
    rows, width = input_ids.shape
    lengths = attention_mask.sum(dim=1).tolist()
    spans = []  # (row, start, end) of each part
    for row in range(rows):
        seg = segments[row, : lengths[row]]
        starts = [0, *(torch.nonzero(seg[1:] != seg[:-1]).squeeze(1) + 1).tolist()]
        spans += [(row, a, b) for a, b in zip(starts, [*starts[1:], lengths[row]], strict=True)]
    longest = max(b - a for _, a, b in spans)
    device = input_ids.device
    ids = torch.zeros(len(spans), longest, dtype=input_ids.dtype, device=device)
    mask = torch.zeros(len(spans), longest, dtype=attention_mask.dtype, device=device)
    index = torch.zeros(rows, width, dtype=torch.long)
    for part, (row, a, b) in enumerate(spans):
        ids[part, : b - a] = input_ids[row, a:b]
        mask[part, : b - a] = 1
        index[row, a:b] = torch.arange(part * longest, part * longest + b - a)
        if b == lengths[row]:  # the row's padding reads its last token
            index[row, b:] = part * longest + b - a - 1
    return Parts(ids, mask, index.to(device))
