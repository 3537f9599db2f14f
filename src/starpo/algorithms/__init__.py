"""StarPO's tensor math: advantage estimators, losses, and rollout-group filtering.

Pure functions over padded (B, T) batches with a loss mask that is 1 on agent-generated
tokens only. Variants are picked by name from dicts (ADVANTAGE_ESTIMATORS, AGGREGATIONS,
KL_ESTIMATORS, FILTER_MODES).
"""

from __future__ import annotations

from starpo.algorithms.advantages import (
    bi_level_gae,
    gae_advantages,
    gigpo_advantages,
    group_normalise,
    grpo_advantages,
    recurring_turn_share,
)
from starpo.algorithms.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
)
from starpo.algorithms.filtering import FILTER_MODES, FilterResult, filter_groups, num_kept
from starpo.algorithms.head import head_logprobs
from starpo.algorithms.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    aggregate,
    aggregation_count,
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    ppo_policy_loss,
    token_logprobs,
    truncated_is_weights,
    value_loss,
)
from starpo.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from starpo.algorithms.rewards import pad_turns, place_rewards, turn_sums

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "FILTER_MODES",
    "KL_ESTIMATORS",
    "AdvantageInputs",
    "AdvantageParams",
    "FilterResult",
    "aggregate",
    "aggregation_count",
    "bi_level_gae",
    "compute_advantages",
    "entropy_from_logits",
    "explained_variance",
    "filter_groups",
    "gae_advantages",
    "gigpo_advantages",
    "grpo_advantages",
    "group_normalise",
    "head_logprobs",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "num_kept",
    "pad_turns",
    "place_rewards",
    "ppo_policy_loss",
    "recurring_turn_share",
    "token_logprobs",
    "turn_sums",
    "truncated_is_weights",
    "value_loss",
]
