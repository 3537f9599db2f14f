"""Trajectories -> padded tensors for the update. Every (B, T) tensor is aligned to token
positions: entry t describes token t (its log-prob, its value, its reward, its mask)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import torch

from starpo.algorithms import pad_turns, place_rewards
from starpo.compute.segments import segment_ids
from starpo.types import Trajectory


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # (B, T) right-padded
    attention_mask: torch.Tensor  # (B, T) 1 on real tokens
    loss_mask: torch.Tensor  # (B, T) float, 1 on the agent's generated tokens
    # (B, T) the log-probs the rollout sampled the agent's tokens with (0 off the mask)
    rollout_logprobs: torch.Tensor
    token_rewards: torch.Tensor  # (B, T) rewards placed on agent tokens
    turn_rewards: torch.Tensor  # (B, K) per-turn training rewards, 0-padded
    turn_ends: torch.Tensor  # (B, K) last agent token of each turn, -1-padded
    scores: torch.Tensor  # (B,) trajectory training reward
    group_ids: torch.Tensor  # (B,) rollouts sharing a seed share a group id
    # (B, K) id of each turn's start state (Turn.state_key; -1 = unknown); build_batch sets it
    turn_states: torch.Tensor | None = None
    advantages: torch.Tensor | None = None  # (B, T)
    returns: torch.Tensor | None = None  # (B, T)
    old_values: torch.Tensor | None = None  # (B, T)
    ref_logprobs: torch.Tensor | None = None  # (B, T)
    # (B, T) the old policy's log-probs, the PPO ratio's denominator; None until known
    # (the rollout's, or recomputed: `starpo.trainer.prepare` says when each is set)
    old_logprobs: torch.Tensor | None = None
    # (B, T) which of its row's sequences a token is in, when a context window made rows of
    # several (`compute.segments`); None = one sequence a row
    segment_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def for_scoring(
        cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
    ) -> TrainBatch:
        """Rows for the training forward alone (log-probs of the `loss_mask` tokens): the
        fields only the update reads are zeros, every row in group 0."""
        zeros = torch.zeros(input_ids.shape)
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            rollout_logprobs=zeros,
            token_rewards=zeros,
            turn_rewards=zeros[:, :1],
            turn_ends=torch.zeros(len(input_ids), 1, dtype=torch.long),
            scores=zeros[:, 0],
            group_ids=torch.zeros(len(input_ids), dtype=torch.long),
        )

    def select(self, index: torch.Tensor | list[int]) -> TrainBatch:
        """Rows `index`, trimmed to their longest sequence (less padding to compute)."""
        index = torch.as_tensor(index, dtype=torch.long)
        width = int(self.attention_mask[index].sum(dim=1).max())
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                out[f.name] = None
            elif f.name in ("turn_rewards", "turn_ends", "turn_states", "scores", "group_ids"):
                out[f.name] = value[index]
            else:
                out[f.name] = value[index, :width]
        return TrainBatch(**out)

    def split(self, size: int) -> Iterator[tuple[torch.Tensor, TrainBatch]]:
        """(row indices, rows) of consecutive chunks of at most `size` rows, in order."""
        for first in range(0, len(self), size):
            rows = torch.arange(first, min(first + size, len(self)))
            yield rows, self.select(rows)

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(
            **{
                f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                for f in fields(self)
            }
        )


def state_ids(trajectories: list[Trajectory], width: int) -> torch.Tensor:
    """(B, K) ids of the turns' start states: equal `Turn.state_key` digests share an id
    (numbered in order of appearance); a turn without a key, and padding, get -1."""
    ids: dict[str, int] = {}
    out = torch.full((len(trajectories), width), -1, dtype=torch.long)  # (B, K)
    for row, t in enumerate(trajectories):
        for k, turn in enumerate(t.turns):
            if turn.state_key:
                out[row, k] = ids.setdefault(turn.state_key, len(ids))
    return out


def padded(
    rows: Sequence[Sequence[float]], width: int, fill: float = 0, dtype: torch.dtype = torch.float
) -> torch.Tensor:
    """(len(rows), width) tensor of `rows`, each right-padded with `fill`."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for index, row in enumerate(rows):
        out[index, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def build_batch(
    trajectories: list[Trajectory], pad_token_id: int, per_turn_rewards: bool
) -> TrainBatch:
    """Pad trajectories into a TrainBatch; rewards are the training rewards (with penalties)."""
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    input_ids = padded([t.token_ids for t in trajectories], width, pad_token_id, torch.long)
    attention = padded([[1] * len(t.token_ids) for t in trajectories], width, 0, torch.long)
    loss_mask = padded([t.loss_mask for t in trajectories], width)
    logprobs = padded([t.logprobs for t in trajectories], width)
    rewards = [[turn.reward for turn in t.turns] for t in trajectories]
    ends = [list(t.turn_ends) for t in trajectories]
    turn_rewards, turn_ends = pad_turns(rewards, ends)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        rollout_logprobs=logprobs * loss_mask,
        token_rewards=place_rewards((n, width), rewards, ends, per_turn=per_turn_rewards),
        turn_rewards=turn_rewards,
        turn_ends=turn_ends,
        turn_states=state_ids(trajectories, turn_ends.shape[1]),
        scores=torch.tensor([t.reward for t in trajectories], dtype=torch.float),
        group_ids=torch.tensor([t.group for t in trajectories]),
        segment_ids=segment_ids([list(t.context_resets) for t in trajectories], width),
    )
