"""StarPO-S uncertainty-based rollout filtering: keep the groups whose rewards vary most.

A group is the set of rollouts that share one initial state. A group whose rollouts all
earn the same reward carries no learning signal under a group baseline, and low in-group
reward std is the early sign of the Echo Trap, so StarPO-S trains only on the top
`filter_ratio` fraction of groups ranked by in-group reward std.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FilterResult:
    """Which groups survive the filter, and the std statistics logged for it."""

    kept: list[int]  # indices of kept groups, ascending
    group_std: list[float]  # unbiased in-group reward std of every group
    std_all: float  # mean of group_std over all groups
    std_kept: float  # mean of group_std over the kept groups


def _std(values: Sequence[float]) -> float:
    """Unbiased sample std (torch.std's default, as RAGEN uses); 0 for a group of one.

    math.fsum sums exactly-then-rounds, so the result does not depend on the order of the
    rewards: two groups holding the same rewards get bit-identical stds and tie.
    """
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def _top_std(group_std: list[float]) -> list[int]:
    return sorted(range(len(group_std)), key=lambda g: (-group_std[g], g))


def _bottom_std(group_std: list[float]) -> list[int]:
    return sorted(range(len(group_std)), key=lambda g: (group_std[g], g))


# Each mode ranks group indices, best first; ties go to the lower group index.
FILTER_MODES: dict[str, Callable[[list[float]], list[int]]] = {
    "top_std": _top_std,  # StarPO-S: most uncertain groups first
    "bottom_std": _bottom_std,  # ablation: least uncertain groups first
}


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
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r}; valid: {sorted(FILTER_MODES)}")
    if isinstance(group_rewards, Tensor):
        if group_rewards.dim() != 2:
            raise ValueError(f"group_rewards tensor must be (G, N), got {group_rewards.shape}")
        group_rewards = group_rewards.detach().to(torch.float64).tolist()
    groups = [[float(r) for r in rewards] for rewards in group_rewards]
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("filter_groups needs at least one group and one reward per group")
    group_std = [_std(g) for g in groups]
    kept = sorted(FILTER_MODES[mode](group_std)[: num_kept(len(groups), ratio)])
    return FilterResult(
        kept=kept,
        group_std=group_std,
        std_all=math.fsum(group_std) / len(group_std),
        std_kept=math.fsum(group_std[g] for g in kept) / len(kept),
    )
