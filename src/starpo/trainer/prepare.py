"""The update's preparation, before any gradient: old log-probs (the rollout's, or
recomputed under the current actor), reference log-probs, old values, advantages and
returns, all filled into the `TrainBatch`.

Two fields, one meaning each: `batch.rollout_logprobs` are the log-probs the rollout
sampled with (set by `build_batch`, never changed); `batch.old_logprobs` are the old
policy's, the PPO ratio's denominator, None until known. When each is set:
- recompute off: `prepare` sets them to the rollout's (the sampler is the old policy);
- recompute on, with a KL penalty in the reward: `prepare` recomputes them (that KL needs
  them before any update);
- recompute on otherwise: `ppo_update` fills them in: `fill_old_logprobs` recomputes every
  row outside the first mini-batch, that mini-batch's forward supplies its own
  (`actor_loss`), and `keep_old_logprobs` writes those back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from starpo.algorithms import (
    AdvantageInputs,
    aggregate,
    compute_advantages,
    explained_variance,
    kl_penalty,
    masked_mean,
    recurring_turn_share,
    turn_sums,
)
from starpo.compute.batch import TrainBatch
from starpo.compute.forward import policy_logprobs, reference_logprobs
from starpo.trainer.train_models import TrainModels
from starpo.trainer.update_settings import UpdateSettings


def map_rows(
    batch: TrainBatch, chunk: int, fn: Callable[[TrainBatch], torch.Tensor]
) -> torch.Tensor:
    """`fn` over consecutive chunks of `chunk` rows (memory), stitched back to (B, T).
    Rows come in group order, so each chunk still shares its group's prompt prefix."""
    out = torch.zeros_like(batch.loss_mask)
    for rows, part_batch in batch.split(chunk):
        part = fn(part_batch)  # (b, t <= T): select trims trailing padding
        out[rows, : part.shape[1]] = part.to(out.dtype)
    return out


def logprob_mismatch(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict:
    """|training log-prob - rollout log-prob| over agent tokens: mean and max."""
    diff = (train - rollout).abs()
    has = bool(mask.bool().any())
    return {
        "rollout/logprob_diff_mean": float(masked_mean(diff, mask)),
        "rollout/logprob_diff_max": float(diff[mask.bool()].max()) if has else 0.0,
    }


@torch.no_grad()
def recomputed_logprobs(
    batch: TrainBatch,
    models: TrainModels,
    settings: UpdateSettings,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probs (B, T) of the agent tokens under the current actor, for `rows` only (the
    others 0; default all), micro-batch by micro-batch."""
    out = torch.zeros_like(batch.loss_mask)
    rows = torch.arange(len(batch)) if rows is None else rows
    if not len(rows):
        return out
    part = batch.select(rows)
    temperature = settings.temperature
    with models.precision.autocast():
        logprobs = map_rows(
            part,
            settings.optim.micro_batch_size,
            lambda b: policy_logprobs(models.actor, b, temperature, False)[0],
        )
    out[rows, : logprobs.shape[1]] = logprobs
    return out


def fill_old_logprobs(
    batch: TrainBatch, first_rows: torch.Tensor, models: TrainModels, settings: UpdateSettings
) -> None:
    """Recompute the old log-probs of every row outside `first_rows` (the first mini-batch)
    before any update; those rows are left to that mini-batch's own forward (marked None in
    its copy, see `actor_loss`). Exact: before the first optimizer step the policy that
    trains IS the old policy, so its detached log-probs are the old log-probs. With one
    epoch and one mini-batch, nothing is recomputed at all."""
    first = torch.zeros(len(batch), dtype=torch.bool)
    first[first_rows] = True
    others = torch.nonzero(~first)[:, 0]
    batch.old_logprobs = recomputed_logprobs(batch, models, settings, others)


def keep_old_logprobs(batch: TrainBatch, rows: torch.Tensor, mini: TrainBatch) -> dict:
    """Copy the first mini-batch's own old log-probs (rows `rows`) into the batch, whose
    other rows `fill_old_logprobs` filled; return their mismatch with the rollout's."""
    batch.old_logprobs[rows, : mini.old_logprobs.shape[1]] = mini.old_logprobs
    return logprob_mismatch(batch.old_logprobs, batch.rollout_logprobs, batch.loss_mask)


def old_logprobs_recomputed(setting: bool | None, exact_rollout_logprobs: bool) -> bool:
    """Whether the update recomputes old log-probs (algorithm.recompute_old_logprobs):
    auto (None) uses the rollout's only when the backend computes them exactly as the
    update does (the same model, dtype and kernels)."""
    return (not exact_rollout_logprobs) if setting is None else setting


@torch.no_grad()
def prepare(
    batch: TrainBatch,
    models: TrainModels,
    settings: UpdateSettings,
    recompute_old_logprobs: bool,
    advantage_weights: list[float] | None = None,
) -> dict[str, float]:
    """Fill in old log-probs (recomputed or the rollout's), reference log-probs, old values,
    advantages and returns; no gradients. `advantage_weights`: one factor per row that
    scales its advantages once they are computed (and whitened): the filter's soft
    reweighting and loss scale (`episodes.KeptGroups`).

    Recomputed old log-probs are left to `ppo_update` (`batch.old_logprobs` stays None):
    it knows which rows its first mini-batch trains on, whose old log-probs are the
    training forward's own (see `fill_old_logprobs`). Only a KL penalty in the reward needs
    them here, before any update.
    """
    algo, metrics = settings.algorithm, {}
    temperature, chunk = settings.temperature, settings.optim.micro_batch_size
    autocast = models.precision.autocast
    if not recompute_old_logprobs:
        batch.old_logprobs = batch.rollout_logprobs
    elif algo.uses_reference and algo.kl_in_reward:  # the reward's KL needs them now
        batch.old_logprobs = recomputed_logprobs(batch, models, settings)
        metrics.update(
            logprob_mismatch(batch.old_logprobs, batch.rollout_logprobs, batch.loss_mask)
        )
    # else `ppo_update` fills them in, most of them for free: see `fill_old_logprobs`
    scores, turn_rewards = batch.scores, batch.turn_rewards
    if algo.uses_reference:
        with autocast():
            batch.ref_logprobs = map_rows(
                batch,
                chunk,
                lambda b: reference_logprobs(models.actor, models.reference, b, temperature),
            )
        if algo.kl_in_reward:
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, algo.kl_loss_estimator)
            kl = kl * batch.loss_mask  # (B, T)
            # Every estimator sees the penalty: gae per token, grpo in the score, bi-level
            # GAE in each turn's reward (the sum of its tokens' KL).
            batch.token_rewards = batch.token_rewards - algo.kl_coef * kl
            scores = scores - algo.kl_coef * kl.sum(dim=1)
            turn_rewards = turn_rewards - algo.kl_coef * turn_sums(kl, batch.turn_ends)
            metrics["actor/reward_kl"] = float(masked_mean(kl, batch.loss_mask))
    if models.critic is not None:
        with autocast():
            values = map_rows(batch, chunk, models.critic)
        batch.old_values = values * batch.loss_mask
    inputs = AdvantageInputs(
        mask=batch.loss_mask,
        token_rewards=batch.token_rewards,
        values=batch.old_values,
        scores=scores,
        group_ids=batch.group_ids,
        turn_rewards=turn_rewards,
        turn_ends=batch.turn_ends,
        turn_states=batch.turn_states,
    )
    batch.advantages, batch.returns = compute_advantages(
        algo.adv_estimator, inputs, **algo.advantage_params()
    )
    if advantage_weights is not None:
        weights = torch.tensor(advantage_weights, dtype=batch.advantages.dtype)
        batch.advantages = batch.advantages * weights.to(batch.advantages.device)[:, None]
    # The turns GiGPO's step level can credit (logged for every estimator: it says whether
    # states recur within groups at all).
    if batch.turn_states is not None:
        metrics["rollout/recurring_state_share"] = recurring_turn_share(
            batch.group_ids, batch.turn_states, batch.turn_ends
        )
    metrics["actor/advantage_mean"] = float(masked_mean(batch.advantages, batch.loss_mask))
    # The advantages reduced as the loss reduces them (algorithm.loss_agg): the way the
    # update moves the sampled tokens' log-probs on balance. Below 0 under token_mean when
    # long failing episodes outweigh short successes: the update then mostly pushes down.
    metrics["actor/advantage_aggregated"] = float(
        aggregate(batch.advantages, batch.loss_mask, algo.loss_agg)
    )
    if batch.returns is not None:
        metrics["critic/returns_mean"] = float(masked_mean(batch.returns, batch.loss_mask))
        metrics["critic/values_mean"] = float(masked_mean(batch.old_values, batch.loss_mask))
        metrics["critic/explained_var"] = explained_variance(
            batch.old_values, batch.returns, batch.loss_mask
        )
    return metrics
