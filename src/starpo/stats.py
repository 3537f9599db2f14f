"""The statistics of episodes and groups, as small pure functions (stdlib only).

`starpo.evaluation.summary.summarise` (success interval, pass@k), the StarPO-S filter (in-group
reward std), the trainer's `rollout/zero_std_groups` and `signal/*` metrics all compute
through this module, so each quantity has one definition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: A group whose reward std is below this earns the same reward in every rollout: under a
#: group baseline it gives no learning signal (the tolerance absorbs float rounding).
ZERO_STD = 1e-8

#: Rewards closer than this, relative to the larger magnitude (at least 1), are equal: a
#: float32 return of 0.8 computed two ways may differ in its last bit (1 ulp = 6e-8), and
#: such a difference must not count as a learning signal. Real reward gaps are far wider
#: (Sokoban's smallest is 0.1).
EQUAL_REWARD_TOLERANCE = 1e-6


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; 0.0 for no values."""
    return sum(values) / len(values) if values else 0.0


def ratio(num: float, den: float) -> float:
    """num / den, or 0.0 when den is 0 (a rate with nothing to count is reported as 0)."""
    return float(num) / float(den) if den else 0.0


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (sound at 0% and 100%, unlike Wald).

    centre = (p + z^2 / 2n) / (1 + z^2 / n)
    half   = z sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n)
    """
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k for one seed: P(at least one of k samples drawn from n succeeds).

    pass@k = 1 - C(n - c, k) / C(n, k)   (Chen et al. 2021)
    """
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def sample_std(values: Sequence[float]) -> float:
    """Unbiased sample std (torch.std's default, as RAGEN uses); 0.0 for fewer than 2 values.

    math.fsum sums exactly-then-rounds, so the result does not depend on the order of the
    values: two groups holding the same rewards get bit-identical stds and tie.
    """
    n = len(values)
    if n < 2:
        return 0.0
    centre = math.fsum(values) / n
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / (n - 1))


def rewards_equal(values: Sequence[float]) -> bool:
    """Whether every value equals the others up to float rounding (`EQUAL_REWARD_TOLERANCE`
    relative to the largest magnitude, at least 1); True for fewer than 2 values. The one
    rule for "this group's rewards do not vary" (the filter, GRPO's baseline, the signal
    metrics); `starpo.algorithms.advantages.constant_groups` is its tensor form."""
    if len(values) < 2:
        return True
    top, bottom = max(values), min(values)
    return top - bottom <= EQUAL_REWARD_TOLERANCE * max(1.0, abs(top), abs(bottom))


def group_reward_std(values: Sequence[float]) -> float:
    """A group's reward std as the filter ranks it: `sample_std`, and exactly 0.0 for a group
    whose rewards are equal up to rounding (`rewards_equal`)."""
    return 0.0 if rewards_equal(values) else sample_std(values)


def group_signal(rewards: Sequence[Sequence[float]], solved: Sequence[Sequence[bool]]) -> dict:
    """Where a step's learning signal is: each env group's rewards and successes ->
    `informative_groups` (share whose rewards vary: the only groups GRPO learns from),
    `all_failed_groups` (no rollout succeeded), `all_solved_groups` (every rollout did) and
    `pass_rate` (the mean over groups of the share of rollouts that succeeded). A binary
    reward's signal peaks at a pass rate of 1/2; with a shaped reward (Sokoban's step costs)
    a group that failed throughout may still vary, so the shares need not sum to 1."""
    if len(rewards) != len(solved):
        raise ValueError(f"{len(rewards)} reward groups but {len(solved)} success groups")
    count = len(rewards)
    rates = [ratio(sum(map(bool, group)), len(group)) for group in solved]
    return {
        "informative_groups": ratio(sum(not rewards_equal(g) for g in rewards), count),
        "all_failed_groups": ratio(sum(rate == 0.0 for rate in rates), count),
        "all_solved_groups": ratio(sum(rate == 1.0 for rate in rates), count),
        "pass_rate": mean(rates),
    }


def zero_std_share(group_std: Sequence[float]) -> float:
    """Share of groups whose reward std is below `ZERO_STD` (0.0 for no groups)."""
    return ratio(sum(s < ZERO_STD for s in group_std), len(group_std))
