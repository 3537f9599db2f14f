"""StarPO-S uncertainty-based rollout filtering: keep the groups whose rewards vary most.

A group is the set of rollouts that share one initial state. A group whose rollouts all
earn the same reward carries no learning signal under a group baseline, and low in-group
reward std is the early sign of the Echo Trap, so StarPO-S trains only on the top
`filter_ratio` fraction of groups ranked by in-group reward std.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from starpo.registry import FILTER_MODES
from starpo.stats import sample_std, zero_std_share


@dataclass(frozen=True)
class FilterResult:
    """Which groups survive the filter, and the std statistics logged for it."""

    kept: list[int]  # indices of kept groups, ascending
    group_std: list[float]  # unbiased in-group reward std of every group
    std_all: float  # mean of group_std over all groups
    std_kept: float  # mean of group_std over the kept groups

    @property
    def zero_std_groups(self) -> float:
        """Share of groups with (numerically) zero reward std: no signal under a baseline."""
        return zero_std_share(self.group_std)


# Each mode ranks group indices, best first; ties go to the lower group index. The modes
# are registered by name in starpo.registry.FILTER_MODES.


def highest_std_first(group_std: list[float]) -> list[int]:
    """top_std (StarPO-S): the most uncertain groups first."""
    return sorted(range(len(group_std)), key=lambda g: (-group_std[g], g))


def lowest_std_first(group_std: list[float]) -> list[int]:
    """bottom_std (ablation): the least uncertain groups first."""
    return sorted(range(len(group_std)), key=lambda g: (group_std[g], g))


def num_kept(num_groups: int, ratio: float) -> int:
    """Groups kept: max(1, round_half_up(ratio * G)).

    RAGEN truncates (int(ratio * G)); rounding half up keeps e.g. 0.25 of 6 groups at 2
    instead of 1, and the 1e-9 absorbs float error such as 0.35 * 10 = 3.4999999999999996.
    """
    return max(1, min(num_groups, math.floor(ratio * num_groups + 0.5 + 1e-9)))


def filter_groups(
    group_rewards: Sequence[Sequence[float]] | Tensor, ratio: float, mode: str = "top_std"
) -> FilterResult:
    """Rank groups by in-group reward std and keep the first max(1, round(ratio * G)).

    `group_rewards` is one reward per rollout for each of the G groups: a (G, N) tensor or a
    list of lists (groups may differ in size). ratio in (0, 1]; ratio = 1 keeps every group.
    Modes: FILTER_MODES ("top_std": highest std first; "bottom_std": lowest first).
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"filter ratio must be in (0, 1], got {ratio}")
    rank = FILTER_MODES[mode]
    if isinstance(group_rewards, Tensor):
        if group_rewards.dim() != 2:
            raise ValueError(f"group_rewards tensor must be (G, N), got {group_rewards.shape}")
        group_rewards = group_rewards.detach().to(torch.float64).tolist()
    groups = [[float(r) for r in rewards] for rewards in group_rewards]
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("filter_groups needs at least one group and one reward per group")
    group_std = [sample_std(g) for g in groups]
    kept = sorted(rank(group_std)[: num_kept(len(groups), ratio)])
    return FilterResult(
        kept=kept,
        group_std=group_std,
        std_all=math.fsum(group_std) / len(group_std),
        std_kept=math.fsum(group_std[g] for g in kept) / len(kept),
    )
