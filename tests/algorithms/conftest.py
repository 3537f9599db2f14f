"""Random multi-turn batches for the algorithm tests, built with plain Python.

A sequence looks like a chat: a prompt (mask 0), then turns of agent tokens (mask 1)
separated by observation tokens (mask 0), then padding (mask 0), e.g. 0 0 1 1 0 0 1 1 1 0.
Row 0 of every batch has no agent tokens at all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch


@dataclass
class Batch:
    mask: list[list[int]]  # (B, T)
    turn_ends: list[list[int]]  # per sequence: last agent token of each turn
    turn_rewards: list[list[float]]  # per sequence: one reward per turn
    values: list[list[float]]  # (B, T), arbitrary also off the mask

    def mask_t(self) -> torch.Tensor:
        return torch.tensor(self.mask, dtype=torch.float64)

    def values_t(self) -> torch.Tensor:
        return torch.tensor(self.values, dtype=torch.float64)


def _sequence(rng: random.Random, length: int) -> tuple[list[int], list[int]]:
    mask = [0] * length
    ends: list[int] = []
    pos = rng.randint(0, 3)  # prompt
    while True:
        span = rng.randint(1, 4)
        if pos + span > length:
            break
        for t in range(pos, pos + span):
            mask[t] = 1
        ends.append(pos + span - 1)
        pos += span + rng.randint(1, 3)  # observation tokens between turns
    return mask, ends


def make_batch(seed: int, batch: int = 5, length: int = 16) -> Batch:
    rng = random.Random(seed)
    masks, ends_all, rewards_all = [], [], []
    for b in range(batch):
        mask, ends = _sequence(rng, length) if b > 0 else ([0] * length, [])
        masks.append(mask)
        ends_all.append(ends)
        rewards_all.append([rng.choice([0.0, 1.0, -0.1, rng.uniform(-2, 2)]) for _ in ends])
    values = [[rng.uniform(-1, 1) for _ in range(length)] for _ in range(batch)]
    return Batch(masks, ends_all, rewards_all, values)


@pytest.fixture(scope="session")
def batch_factory():
    return make_batch
