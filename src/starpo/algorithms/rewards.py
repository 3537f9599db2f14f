"""Placing per-turn rewards onto the token grid the advantage estimators read.

A trajectory of K turns gives K turn rewards r_1..r_K and the positions p_1 < ... < p_K of
each turn's last agent token. The estimators take either a dense (B, T) `token_rewards`
(`place_rewards`) or the padded per-turn form (B, K) + (B, K) (`pad_turns`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _check_lengths(
    rewards_per_turn: Sequence[Sequence[float]], turn_ends: Sequence[Sequence[int]]
) -> None:
    if len(rewards_per_turn) != len(turn_ends):
        raise ValueError(
            f"rewards_per_turn has {len(rewards_per_turn)} sequences but turn_ends has "
            f"{len(turn_ends)}; pass one list per sequence in both"
        )
    for i, (rewards, ends) in enumerate(zip(rewards_per_turn, turn_ends, strict=True)):
        if len(rewards) != len(ends):
            raise ValueError(
                f"sequence {i}: {len(rewards)} turn rewards but {len(ends)} turn ends; "
                "each turn needs exactly one reward and one end position"
            )


def place_rewards(
    mask_shape: tuple[int, int] | torch.Size,
    rewards_per_turn: Sequence[Sequence[float]],
    turn_ends: Sequence[Sequence[int]],
    per_turn: bool,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Dense token rewards (B, T), zero except at turn ends.

    per_turn=True:  token_rewards[b, p_k] = r_k for every turn k.
    per_turn=False: token_rewards[b, p_K] = sum_k r_k (the trajectory reward on the last
                    agent token, StarPO's default).
    A sequence with no turns gets an all-zero row. `turn_ends[b]` are token positions in
    [0, T), one per turn, in turn order.
    """
    _check_lengths(rewards_per_turn, turn_ends)
    batch, length = mask_shape
    if len(turn_ends) != batch:
        raise ValueError(f"got turns for {len(turn_ends)} sequences but mask_shape has B={batch}")
    token_rewards = torch.zeros(batch, length, dtype=dtype)  # (B, T)
    for b, (rewards, ends) in enumerate(zip(rewards_per_turn, turn_ends, strict=True)):
        if not ends:
            continue
        if per_turn:
            for reward, end in zip(rewards, ends, strict=True):
                token_rewards[b, end] += reward
        else:
            token_rewards[b, ends[-1]] = float(sum(rewards))
    return token_rewards


def pad_turns(
    rewards_per_turn: Sequence[Sequence[float]],
    turn_ends: Sequence[Sequence[int]],
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """Ragged per-turn lists -> (turn_rewards (B, K) zero-padded, turn_ends (B, K) -1-padded).

    K is the largest number of turns in the batch (at least 1, so the tensors are never
    empty). This is the input form of `bi_level_gae`.
    """
    _check_lengths(rewards_per_turn, turn_ends)
    width = max([1, *(len(ends) for ends in turn_ends)])
    rewards = torch.zeros(len(turn_ends), width, dtype=dtype)  # (B, K)
    ends_t = torch.full((len(turn_ends), width), -1, dtype=torch.long)  # (B, K)
    for b, (row_rewards, row_ends) in enumerate(zip(rewards_per_turn, turn_ends, strict=True)):
        rewards[b, : len(row_rewards)] = torch.tensor(list(row_rewards), dtype=dtype)
        ends_t[b, : len(row_ends)] = torch.tensor(list(row_ends), dtype=torch.long)
    return rewards, ends_t


def turn_sums(token_values: Tensor, turn_ends: Tensor) -> Tensor:
    """Per-turn sums of a per-token quantity: (B, T) and turn ends (B, K) -> (B, K).

    Turn k covers positions (p_{k-1}, p_k] (p_0 = -1), so out[b, k] = sum of
    token_values[b, p_{k-1}+1 .. p_k]; -1-padded turns get 0. Used to move a per-token
    penalty (e.g. the KL in the reward) into per-turn rewards.
    """
    csum = torch.cumsum(token_values, dim=1)  # (B, T)
    valid = turn_ends >= 0  # (B, K)
    at_end = csum.gather(1, turn_ends.clamp(min=0))  # (B, K) cumulative sum up to p_k
    at_end = torch.where(valid, at_end, torch.zeros_like(at_end))
    before = torch.cat([at_end.new_zeros(at_end.shape[0], 1), at_end[:, :-1]], dim=1)
    return torch.where(valid, at_end - before, torch.zeros_like(at_end))
