"""StarPO-S uncertainty-based rollout filtering: keep the groups whose rewards vary most.

A group is the set of rollouts that share one initial state. A group whose rollouts all
earn the same reward carries no learning signal under a group baseline, and low in-group
reward std is the early sign of the Echo Trap, so StarPO-S trains only on the top
`filter_ratio` fraction of groups ranked by in-group reward std.

RAGEN-2 keeps groups by adaptive rules as well (`FilterRule`): a fixed count (`top_k`),
the smallest set holding a share `top_p` of the total score (`top_p`), or every group
scoring at least `min_p` x the best (`min_p`); the score is the reward std or variance.
Instead of (or besides) dropping, `group_weights` scales each group's advantages by its
std relative to the largest (RAGEN-2's soft advantage reweighting), and `loss_scale` the
whole batch's by the kept share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from starpo.registry import FILTER_MODES
from starpo.stats import ZERO_STD, group_reward_std, zero_std_share

#: How `FilterRule.rule` keeps groups (RAGEN-2's rollout_filter_strategy).
RULES = ("ratio", "top_k", "top_p", "min_p")
#: A rule whose number of kept groups changes from step to step with the rewards.
ADAPTIVE_RULES = ("top_p", "min_p")
#: The batch's advantage scale by the kept share (RAGEN-2's filter_loss_scaling).
LOSS_SCALES = {"none": 0.0, "linear": 1.0, "sqrt": 0.5}


@dataclass(frozen=True)
class FilterRule:
    """Which groups `filter_groups` keeps, ranked by `mode` (FILTER_MODES: "top_std" keeps
    the largest scores, "bottom_std" the smallest):

    - "ratio": the first max(1, round_half_up(ratio x G)) (StarPO-S);
    - "top_k": the first `top_k`;
    - "top_p": the fewest first groups whose shares of the total score reach `top_p`,
      the shares `shares`="linear" (score / sum) or "softmax" (of the scores);
    - "min_p": every group whose score is at least `min_p` x the largest.

    The score is the group's reward std, or its variance (`metric`="variance", RAGEN-2's
    reward_variance); the order is the same, the top_p shares and min_p bar are not. With
    `keep_zero_std` off, groups whose rewards do not vary are never kept, and a step where
    none vary keeps nothing. top_p and min_p keep the largest scores only.
    """

    rule: str = "ratio"
    ratio: float = 1.0
    top_k: int = 1
    top_p: float = 1.0
    min_p: float = 0.0
    shares: str = "linear"
    metric: str = "std"
    mode: str = "top_std"
    keep_zero_std: bool = True

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"filter rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"filter ratio must be in (0, 1], got {self.ratio}")
        if self.top_k < 1:
            raise ValueError(f"filter top_k must be >= 1, got {self.top_k}")
        for name in ("top_p", "min_p"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"filter {name} must be in [0, 1], got {getattr(self, name)}")
        if self.shares not in ("linear", "softmax"):
            raise ValueError(f"filter shares must be linear or softmax, got {self.shares!r}")
        if self.metric not in ("std", "variance"):
            raise ValueError(f"filter metric must be std or variance, got {self.metric!r}")
        if self.rule in ADAPTIVE_RULES and self.mode != "top_std":
            raise ValueError(f"filter rule {self.rule} keeps the largest scores: mode top_std")


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
    group_rewards: Sequence[Sequence[float]] | Tensor,
    ratio: float = 1.0,
    mode: str = "top_std",
    rule: FilterRule | None = None,
) -> FilterResult:
    """Rank groups by in-group reward std and keep them by `rule` (default: the first
    max(1, round(ratio * G)) by `mode`, StarPO-S's rule; a `rule` replaces ratio and mode).

    `group_rewards` is one reward per rollout for each of the G groups: a (G, N) tensor or a
    list of lists (groups may differ in size). ratio in (0, 1]; ratio = 1 keeps every group.
    Modes: FILTER_MODES ("top_std": highest std first; "bottom_std": lowest first).
    """
    rule = rule or FilterRule(ratio=ratio, mode=mode)
    if isinstance(group_rewards, Tensor):
        if group_rewards.dim() != 2:
            raise ValueError(f"group_rewards tensor must be (G, N), got {group_rewards.shape}")
        group_rewards = group_rewards.detach().to(torch.float64).tolist()
    groups = [[float(r) for r in rewards] for rewards in group_rewards]
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("filter_groups needs at least one group and one reward per group")
    group_std = [group_reward_std(g) for g in groups]
    kept = choose_groups(group_std, rule)
    return FilterResult(
        kept=kept,
        group_std=group_std,
        std_all=math.fsum(group_std) / len(group_std),
        std_kept=math.fsum(group_std[g] for g in kept) / len(kept) if kept else 0.0,
    )


def choose_groups(group_std: Sequence[float], rule: FilterRule) -> list[int]:
    """The indices (ascending) of the groups `rule` keeps, given each group's reward std."""
    order = FILTER_MODES[rule.mode](list(group_std))  # best first; ties: lower index
    if not rule.keep_zero_std:
        order = [g for g in order if group_std[g] >= ZERO_STD]
    if not order:
        return []
    scores = [s * s if rule.metric == "variance" else s for s in group_std]
    ranked = [scores[g] for g in order]
    if rule.rule == "ratio":
        count = num_kept(len(group_std), rule.ratio)
    elif rule.rule == "top_k":
        count = rule.top_k
    elif rule.rule == "top_p" and rule.top_p >= 1.0:
        # RAGEN-2's no-filter baseline: the whole nucleus, groups of zero share included
        # (summing shares would stop as soon as the varying groups reach 1).
        count = len(order)
    elif rule.rule == "top_p":
        count = nucleus_size(score_shares(ranked, rule.shares), rule.top_p)
    else:  # min_p: the scores are in descending order
        count = sum(score >= rule.min_p * ranked[0] for score in ranked)
    return sorted(order[: min(count, len(order))])


def score_shares(scores: Sequence[float], how: str) -> list[float]:
    """Each score's share of the whole: score / sum ("linear"; equal shares when every
    score is 0) or softmax ("softmax")."""
    if how == "softmax":
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        return [e / math.fsum(exps) for e in exps]
    total = math.fsum(scores)
    return [s / total for s in scores] if total > 0 else [1.0 / len(scores)] * len(scores)


def nucleus_size(shares: Sequence[float], p: float) -> int:
    """How many of the first `shares` it takes for their sum to reach `p` (at least 1; the
    1e-9 absorbs float error, e.g. shares that sum to 0.9999999999)."""
    total = 0.0
    for count, share in enumerate(shares, start=1):
        total += share
        if total >= p - 1e-9:
            return count
    return len(shares)


def group_weights(group_std: Sequence[float]) -> list[float]:
    """Soft advantage reweighting (RAGEN-2): each group's std over the largest, so the most
    uncertain group keeps its advantages and a group whose rewards do not vary gets 0.
    All 1.0 when no group varies (nothing to weigh by)."""
    largest = max(group_std, default=0.0)
    if largest < ZERO_STD:
        return [1.0] * len(group_std)
    return [s / largest for s in group_std]


def loss_scale(kept_share: float, how: str) -> float:
    """The advantage (hence loss) scale for keeping `kept_share` of the trajectories:
    1 ("none"), the share ("linear") or its square root ("sqrt"), RAGEN-2's
    filter_loss_scaling against few kept groups' noisy gradients."""
    if how not in LOSS_SCALES:
        raise ValueError(f"filter loss scale must be one of {', '.join(LOSS_SCALES)}, got {how!r}")
    return kept_share ** LOSS_SCALES[how]
