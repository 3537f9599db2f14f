"""Rows that hold several sequences: a trajectory whose context window dropped turns
(`RolloutSettings.context_window`) saw a fresh prompt at each `Trajectory.context_resets`
offset, so each part is trained as the sequence the policy saw: positions restart at its
first token and no token attends across parts. (B, T) tensors are a `TrainBatch`'s.
"""

from __future__ import annotations

import torch

from starpo.errors import UserError
from starpo.models.compat import uses_sliding_window

#: Attention implementations that take a custom 4D mask (sdpa: boolean, eager: additive).
CUSTOM_MASK_ATTENTION = ("sdpa", "eager")


def takes_custom_mask(config) -> bool:
    """The model takes a custom attention mask and has no sliding window (which the mask
    would drop): rows of several sequences, and packed rows (`packing`), need one."""
    return config._attn_implementation in CUSTOM_MASK_ATTENTION and not uses_sliding_window(config)


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


def segment_positions(segments: torch.Tensor) -> torch.Tensor:
    """(B, T) position of each token in its own part (0 at the part's first token)."""
    columns = torch.arange(segments.shape[1], device=segments.device).expand_as(segments)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    first = torch.where(starts, columns, torch.zeros_like(columns)).cummax(dim=1).values
    return columns - first


def segment_attention_mask(
    segments: torch.Tensor, attention_mask: torch.Tensor, kind: str, dtype: torch.dtype
) -> torch.Tensor:
    """(B, 1, T, T) mask: a token sees the earlier real tokens of its own part (a padding
    token also sees earlier padding, so no softmax is empty). Boolean (True = attend) for
    sdpa, additive for eager attention."""
    index = torch.arange(segments.shape[1], device=segments.device)
    same = segments.unsqueeze(2) == segments.unsqueeze(1)  # (B, T, T) query x key
    real_key = attention_mask.bool().unsqueeze(1)
    padding_query = ~attention_mask.bool().unsqueeze(2)
    allowed = same & (index[None, :, None] >= index[None, None, :]) & (real_key | padding_query)
    if kind == "sdpa":
        return allowed[:, None]
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=segments.device)
    return blocked.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def check_segmentable(config) -> None:
    """A UserError unless the model takes the custom mask several parts a row need."""
    if not takes_custom_mask(config):
        raise UserError(
            "rollout.context_window last_k/single_turn trains each prompt as a sequence of "
            "its own, which needs sdpa or eager attention without a sliding window; use "
            "rollout.context_window=full with this model"
        )


def sequence_inputs(
    config,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    segments: torch.Tensor | None,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """The attention mask (and position ids) a plain forward of these rows takes: the 2D
    padding mask, or for rows of several parts the part-wise mask and positions."""
    if segments is None:
        return {"attention_mask": attention_mask}
    check_segmentable(config)
    kind = config._attn_implementation
    return {
        "attention_mask": segment_attention_mask(segments, attention_mask, kind, dtype),
        "position_ids": segment_positions(segments),
    }
