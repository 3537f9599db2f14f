"""The update stage: advantages, then PPO epochs over mini-batches of trajectories, with
micro-batches accumulating gradients (memory) and one optimizer step per mini-batch."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from starpo.algorithms import (
    AdvantageInputs,
    aggregate,
    compute_advantages,
    explained_variance,
    kl_penalty,
    masked_mean,
    ppo_policy_loss,
    value_loss,
)
from starpo.config import TrainConfig
from starpo.trainer.batch import TrainBatch
from starpo.trainer.forward import policy_logprobs, reference_logprobs
from starpo.trainer.models import TrainModels


@dataclass
class Optimizers:
    actor: torch.optim.Optimizer
    critic: torch.optim.Optimizer | None


def prepare(batch: TrainBatch, models: TrainModels, cfg: TrainConfig) -> dict[str, float]:
    """Fill in reference log-probs, old values, advantages and returns (no gradients)."""
    algo, metrics = cfg.algorithm, {}
    temperature = cfg.rollout.temperature
    scores = batch.scores
    if algo.uses_reference:
        batch.ref_logprobs = reference_logprobs(models.actor, models.reference, batch, temperature)
        if algo.kl_in_reward:
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, algo.kl_estimator)
            kl = kl * batch.loss_mask
            batch.token_rewards = batch.token_rewards - algo.kl_coef * kl
            scores = scores - algo.kl_coef * kl.sum(dim=1)
            metrics["actor/reward_kl"] = float(masked_mean(kl, batch.loss_mask))
    if models.critic is not None:
        with torch.no_grad():
            batch.old_values = models.critic(batch.input_ids, batch.attention_mask)
            batch.old_values = batch.old_values * batch.loss_mask
    inputs = AdvantageInputs(
        mask=batch.loss_mask,
        token_rewards=batch.token_rewards,
        values=batch.old_values,
        scores=scores,
        group_ids=batch.group_ids,
        turn_rewards=batch.turn_rewards,
        turn_ends=batch.turn_ends,
    )
    batch.advantages, batch.returns = compute_advantages(
        algo.adv_estimator,
        inputs,
        gamma=algo.gamma,
        lam=algo.lam,
        gamma_turn=algo.gamma_turn,
        lam_turn=algo.lam_turn,
        gamma_token=algo.gamma_token,
        lam_token=algo.lam_token,
        eps=algo.grpo_eps,
        whiten=algo.whiten_advantages,
    )
    metrics["actor/advantage_mean"] = float(masked_mean(batch.advantages, batch.loss_mask))
    if batch.returns is not None:
        metrics["critic/returns_mean"] = float(masked_mean(batch.returns, batch.loss_mask))
        metrics["critic/values_mean"] = float(masked_mean(batch.old_values, batch.loss_mask))
        metrics["critic/explained_var"] = explained_variance(
            batch.old_values, batch.returns, batch.loss_mask
        )
    return metrics


def actor_loss(
    models: TrainModels, micro: TrainBatch, cfg: TrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO surrogate - entropy bonus (+ KL loss): one micro-batch."""
    algo = cfg.algorithm
    logprobs, entropy = policy_logprobs(models.actor, micro, cfg.rollout.temperature)
    loss, metrics = ppo_policy_loss(
        logprobs,
        micro.old_logprobs,
        micro.advantages,
        micro.loss_mask,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip=algo.dual_clip,
        agg=algo.loss_agg,
    )
    entropy_mean = aggregate(entropy, micro.loss_mask, algo.loss_agg)
    loss = loss - algo.entropy_coef * entropy_mean
    metrics = {f"actor/{k}": v for k, v in metrics.items()}
    metrics["actor/entropy"] = float(entropy_mean.detach())
    if algo.uses_reference and not algo.kl_in_reward:
        kl = aggregate(
            kl_penalty(logprobs, micro.ref_logprobs, algo.kl_estimator),
            micro.loss_mask,
            algo.loss_agg,
        )
        loss = loss + algo.kl_coef * kl
        metrics["actor/kl_loss"] = float(kl.detach())
    return loss, metrics


def critic_loss(
    models: TrainModels, micro: TrainBatch, cfg: TrainConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    values = models.critic(micro.input_ids, micro.attention_mask)
    loss, metrics = value_loss(
        values,
        micro.old_values,
        micro.returns,
        micro.loss_mask,
        clip=cfg.algorithm.value_clip,
        agg=cfg.algorithm.loss_agg,
    )
    return cfg.algorithm.vf_coef * loss, {f"critic/{k}": v for k, v in metrics.items()}


def _step(params: list[nn.Parameter], optimizer: torch.optim.Optimizer, clip: float) -> float:
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def ppo_update(
    batch: TrainBatch,
    models: TrainModels,
    optimizers: Optimizers,
    cfg: TrainConfig,
    generator: torch.Generator,
) -> dict[str, float]:
    """`ppo_epochs` passes over the batch in shuffled mini-batches; returns mean metrics."""
    opt = cfg.optim
    sums: dict[str, list[float]] = defaultdict(list)
    actor_params = [p for p in models.actor.parameters() if p.requires_grad]
    critic_params = (
        [p for p in models.critic.parameters() if p.requires_grad]
        if models.critic is not None
        else []
    )
    for _ in range(opt.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for start in range(0, len(batch), opt.mini_batch_size):
            mini = order[start : start + opt.mini_batch_size]
            # Group members share their prompt: keeping them in the same micro-batches lets
            # the forward pass encode it once (the mini-batch gradient is the same sum).
            mini = mini[torch.argsort(batch.group_ids[mini], stable=True)]
            for first in range(0, len(mini), opt.micro_batch_size):
                rows = mini[first : first + opt.micro_batch_size]
                micro = batch.select(rows)
                weight = len(rows) / len(mini)  # micro-batches add up to the mini-batch mean
                loss, metrics = actor_loss(models, micro, cfg)
                (loss * weight).backward()
                if models.critic is not None:
                    closs, cmetrics = critic_loss(models, micro, cfg)
                    (closs * weight).backward()
                    metrics.update(cmetrics)
                for key, value in metrics.items():
                    sums[key].append(value)
            sums["actor/grad_norm"].append(_step(actor_params, optimizers.actor, opt.grad_clip))
            if optimizers.critic is not None:
                sums["critic/grad_norm"].append(
                    _step(critic_params, optimizers.critic, opt.grad_clip)
                )
    return {key: sum(values) / len(values) for key, values in sums.items()}
