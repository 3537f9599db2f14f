"""The advantage estimators by name: what they may read (`AdvantageInputs`), their knobs
(`AdvantageParams`), the adapters that starpo.registry.ADVANTAGE_ESTIMATORS names, and
`compute_advantages`, which runs one by name.

An adapter checks that the inputs its estimator needs are there, calls the pure function
of `starpo.algorithms.advantages` (the equations live there), and whitens where the
estimator's targets are not already normalised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from starpo.algorithms.advantages import (
    bi_level_gae,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
)
from starpo.algorithms.masked import masked_sum, masked_whiten
from starpo.registry import ADVANTAGE_ESTIMATORS

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageInputs",
    "AdvantageParams",
    "Estimator",
    "compute_advantages",
]


@dataclass
class AdvantageInputs:
    """What an estimator may read; each estimator states which fields it needs."""

    mask: Tensor  # (B, T) 1 on agent tokens
    token_rewards: Tensor | None = None  # (B, T) rewards on turn-end tokens (gae; grpo scores)
    values: Tensor | None = None  # (B, T) critic values (gae, bi_level_gae)
    scores: Tensor | None = None  # (B,) trajectory scores (grpo; default: sum of rewards)
    group_ids: Tensor | None = None  # (B,) long, same id = same initial state (grpo)
    turn_rewards: Tensor | None = None  # (B, K) per-turn rewards, padded (bi_level_gae)
    turn_ends: Tensor | None = None  # (B, K) long last-token positions, -1 padded
    turn_states: Tensor | None = None  # (B, K) long id of each turn's start state (gigpo)


@dataclass(frozen=True)
class AdvantageParams:
    """Knobs of the estimators (defaults: RAGEN, arXiv 2504.20073, and its public config)."""

    gamma: float = 1.0  # gae discount
    lam: float = 1.0  # gae lambda
    gamma_turn: float = 0.95  # bi-level: discount across turns
    lam_turn: float = 1.0
    gamma_token: float = 1.0  # bi-level: discount inside a turn
    lam_token: float = 1.0
    eps: float = 1e-6  # grpo: added to the group std
    norm_by_std: bool = True  # grpo, gigpo: divide by the group std (False: only centre)
    gamma_step: float = 0.95  # gigpo: discount of a turn's return (the paper's 0.95)
    step_weight: float = 1.0  # gigpo: A = A_episode + step_weight * A_step (the paper's 1)
    whiten: bool = True  # gae / bi_level_gae: whiten advantages over masked tokens
    # An estimator's own parameters (algorithm.estimator_args): a plugin estimator reads
    # its knobs here, with no edit to this class, the config or the trainer.
    extra: Mapping[str, Any] = field(default_factory=dict)


def _require(value: Tensor | None, field: str, estimator: str, why: str) -> Tensor:
    if value is None:
        raise ValueError(f"advantage estimator {estimator!r} needs inputs.{field}: {why}")
    return value


def _maybe_whiten(advantages: Tensor, mask: Tensor, params: AdvantageParams) -> Tensor:
    return masked_whiten(advantages, mask) if params.whiten else advantages


def gae_estimator(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor | None]:
    values = _require(inputs.values, "values", "gae", "GAE needs a critic")
    rewards = _require(inputs.token_rewards, "token_rewards", "gae", "see place_rewards")
    adv, ret = gae_advantages(rewards, values, inputs.mask, params.gamma, params.lam)
    return _maybe_whiten(adv, inputs.mask, params), ret


def grpo_estimator(
    inputs: AdvantageInputs, params: AdvantageParams
) -> tuple[Tensor, Tensor | None]:
    group_ids = _require(inputs.group_ids, "group_ids", "grpo", "groups define the baseline")
    scores = inputs.scores
    if scores is None:
        rewards = _require(inputs.token_rewards, "token_rewards", "grpo", "or pass scores")
        scores = masked_sum(rewards, inputs.mask, dim=1)  # (B,)
    # Already normalised per group: no whitening on top, and no critic, so no returns.
    adv = grpo_advantages(scores, group_ids, inputs.mask, params.eps, params.norm_by_std)
    return adv, None


def _require_turns(inputs: AdvantageInputs, estimator: str) -> tuple[Tensor, Tensor]:
    """(turn_rewards, turn_ends) of an estimator that credits turns (see pad_turns)."""
    turn_rewards = _require(inputs.turn_rewards, "turn_rewards", estimator, "see pad_turns")
    return turn_rewards, _require(inputs.turn_ends, "turn_ends", estimator, "see pad_turns")


def bi_level_estimator(
    inputs: AdvantageInputs, params: AdvantageParams
) -> tuple[Tensor, Tensor | None]:
    name = "bi_level_gae"
    values = _require(inputs.values, "values", name, "bi-level GAE needs a critic")
    turn_rewards, turn_ends = _require_turns(inputs, name)
    adv, ret = bi_level_gae(
        turn_rewards,
        turn_ends,
        values,
        inputs.mask,
        params.gamma_turn,
        params.lam_turn,
        params.gamma_token,
        params.lam_token,
    )
    return _maybe_whiten(adv, inputs.mask, params), ret


def gigpo_estimator(
    inputs: AdvantageInputs, params: AdvantageParams
) -> tuple[Tensor, Tensor | None]:
    name = "gigpo"
    group_ids = _require(inputs.group_ids, "group_ids", name, "groups define the baseline")
    turn_rewards, turn_ends = _require_turns(inputs, name)
    why = "each turn's env state id (Turn.state_key)"
    turn_states = _require(inputs.turn_states, "turn_states", name, why)
    scores = inputs.scores
    if scores is None:  # the trajectory's return: the sum of its turns' rewards
        scores = torch.where(turn_ends >= 0, turn_rewards, turn_rewards.new_zeros(())).sum(1)
    adv = gigpo_advantages(
        scores,
        group_ids,
        turn_rewards,
        turn_ends,
        turn_states,
        inputs.mask,
        params.gamma_step,
        params.step_weight,
        params.eps,
        params.norm_by_std,
    )
    return adv, None  # group-normalised at both levels: no whitening, no critic


# Estimators take (inputs, params) and return (advantages, returns); they are registered
# by name in starpo.registry.ADVANTAGE_ESTIMATORS.
Estimator = Callable[[AdvantageInputs, AdvantageParams], tuple[Tensor, Tensor | None]]


def compute_advantages(
    name: str, inputs: AdvantageInputs, **params: Any
) -> tuple[Tensor, Tensor | None]:
    """Run the estimator `name` from ADVANTAGE_ESTIMATORS -> (advantages (B, T), returns).

    `params` are AdvantageParams fields (gamma, lam, gamma_turn, lam_turn, gamma_token,
    lam_token, eps, norm_by_std, gamma_step, step_weight, whiten, extra: see
    `AlgorithmConfig.advantage_params` for the config's). returns is None for
    critic-free estimators (grpo, gigpo).
    """
    estimator = ADVANTAGE_ESTIMATORS[name]
    known = {f.name for f in fields(AdvantageParams)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown advantage params {unknown}; valid: {sorted(known)}")
    return estimator(inputs, AdvantageParams(**params))
