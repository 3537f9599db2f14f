"""The update stage: PPO epochs over mini-batches of trajectories (prepared by
`starpo.trainer.prepare`: advantages, old log-probs), with micro-batches accumulating
gradients (memory only: the result does not depend on their size) and one optimizer
update per mini-batch, skipped when anything is non-finite."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from starpo.algorithms import (
    aggregate,
    aggregation_count,
    kl_penalty,
    masked_mean,
    ppo_policy_loss,
    truncated_is_weights,
    value_loss,
)
from starpo.compute import flops
from starpo.compute.batch import TrainBatch
from starpo.compute.forward import policy_logprobs
from starpo.compute.packing import prompt_clusters
from starpo.compute.weights import trainable_parameters
from starpo.config import AlgorithmConfig
from starpo.errors import UserError
from starpo.trainer.optim import Optimizers
from starpo.trainer.prepare import fill_old_logprobs, keep_old_logprobs, logprob_mismatch
from starpo.trainer.train_models import TrainModels
from starpo.trainer.update_settings import UpdateSettings


class DataParallel(Protocol):
    """What `ppo_update` needs from data-parallel learners (one learner's side; the Ray
    learners in `starpo.trainer.learners.GradientSync` implement it over gloo)."""

    def owns(self, micro_index: int) -> bool:
        """Whether this learner runs micro-batch `micro_index`."""

    def sum_(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the learners, in place."""

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of `params` over the learners."""

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` holds on every learner."""

    def gather(self, obj: Any) -> list[Any]:
        """Every learner's `obj`, in rank order."""


#: The FLOPs of an update's passes with gradients (`flops`); the trainer divides them by
#: the update's seconds for `perf/update_gflops` and `perf/update_peak_share`.
UPDATE_FLOPS = "perf/update_flops"


class NonFiniteUpdates(UserError):
    """Too many consecutive updates had a NaN/Inf loss or gradient: the run stops."""


@dataclass
class SkipCounter:
    """Consecutive updates skipped for non-finite values, across steps (checkpointed)."""

    limit: int
    consecutive: int = 0

    def record(self, skipped: bool) -> None:
        self.consecutive = self.consecutive + 1 if skipped else 0
        if self.consecutive >= self.limit:
            raise NonFiniteUpdates(
                f"training stopped: {self.consecutive} consecutive updates had a non-finite "
                "(NaN/Inf) loss or gradient norm and were skipped; resume from the last "
                "checkpoint with a lower optim.actor_lr (or model.dtype=fp32), or raise "
                "optim.max_skipped_updates"
            )


# ------------------------------------------------------------------------ losses


def actor_loss(
    models: TrainModels, micro: TrainBatch, settings: UpdateSettings, count: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO surrogate - entropy bonus (+ KL loss) of one micro-batch. `count`: the
    mini-batch's aggregation count, so micro-batch losses add up to the mini-batch loss.

    A micro-batch without old log-probs (None: recomputed ones, before the first update)
    takes this forward's own, detached, and keeps them in `micro.old_logprobs`.
    """
    algo, detach = settings.algorithm, settings.optim.detach_context
    with models.precision.autocast():
        logprobs, entropy = policy_logprobs(
            models.actor, micro, settings.temperature, detach_context=detach
        )
    if micro.old_logprobs is None:  # before any update: the old policy is this one
        micro.old_logprobs = logprobs.detach()
    is_weights = None
    if algo.tis_cap is not None:  # exactly 1 where the old log-probs are the rollout's
        is_weights = truncated_is_weights(micro.old_logprobs, micro.rollout_logprobs, algo.tis_cap)
    loss, metrics = ppo_policy_loss(
        logprobs,
        micro.old_logprobs,
        micro.advantages,
        micro.loss_mask,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip=algo.dual_clip,
        agg=algo.loss_agg,
        count=count,
        is_weights=is_weights,
    )
    entropy_term = aggregate(entropy, micro.loss_mask, algo.loss_agg, count)
    loss = loss - algo.entropy_coef * entropy_term
    metrics = {f"actor/{k}": v for k, v in metrics.items()}
    metrics["actor/entropy"] = float(masked_mean(entropy.detach(), micro.loss_mask))
    with torch.no_grad():
        metrics.update(logprob_mismatch(logprobs, micro.old_logprobs, micro.loss_mask))
    if is_weights is not None:
        metrics["actor/tis_weight_mean"] = float(masked_mean(is_weights, micro.loss_mask))
    if algo.uses_reference and not algo.kl_in_reward:
        kl_mat = kl_penalty(logprobs, micro.ref_logprobs, algo.kl_loss_estimator)
        loss = loss + algo.kl_coef * aggregate(kl_mat, micro.loss_mask, algo.loss_agg, count)
        metrics["actor/kl_loss"] = float(aggregate(kl_mat.detach(), micro.loss_mask, algo.loss_agg))
    return loss, metrics


def critic_loss(
    models: TrainModels, micro: TrainBatch, algo: AlgorithmConfig, count: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    with models.precision.autocast():
        values = models.critic(micro)
    loss, metrics = value_loss(
        values,
        micro.old_values,
        micro.returns,
        micro.loss_mask,
        clip=algo.value_clip,
        agg=algo.loss_agg,
        count=count,
    )
    return algo.vf_coef * loss, {f"critic/{k}": v for k, v in metrics.items()}


# ------------------------------------------------------------------------ update


def _merge(parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Micro-batch metrics -> one mini-batch value each: `*_max` keys take the max, the
    rest a mean weighted by each micro-batch's agent tokens (exact for token means)."""
    total = sum(w for w, _ in parts) or 1.0
    merged: dict[str, float] = {}
    for weight, metrics in parts:
        for key, value in metrics.items():
            if key.endswith("_max"):
                merged[key] = max(merged.get(key, -math.inf), value)
            else:
                merged[key] = merged.get(key, 0.0) + value * weight / total
    return merged


def micro_batch_flops(
    models: TrainModels, micro: TrainBatch, detach_context: bool = False
) -> float:
    """FLOPs of one micro-batch's forward and backward in the update (actor, and critic
    when there is one), counted by `flops`; 0 for a model of unknown shape."""
    factor = flops.WITH_FROZEN_BACKWARD if models.uses_lora else flops.WITH_BACKWARD
    actor_pass = flops.detached_context_pass if detach_context else flops.training_pass
    passes = [actor_pass(models.actor, micro, factor=factor)]
    if models.critic is not None:
        passes.append(flops.critic_pass(models.critic.backbone, micro, factor))
    return sum(p.flops for p in passes if p is not None)


def accumulate_gradients(
    mini: TrainBatch,
    models: TrainModels,
    settings: UpdateSettings,
    sync: DataParallel | None = None,
) -> tuple[dict[str, float], bool]:
    """Backward the mini-batch's losses micro-batch by micro-batch (gradients add up to
    those of one pass over the whole mini-batch); return (metrics, every loss finite).
    Without old log-probs (None), the mini-batch gets its forwards' own (see `actor_loss`).
    Metrics include `perf/update_flops`: the FLOPs of all the mini-batch's passes.

    With `sync` (data-parallel learners) this learner runs only its share of the
    micro-batches, then the learners sum gradients and old log-probs and share metrics, so
    every learner ends with what one learner would have over all micro-batches."""
    agg, size = settings.algorithm.loss_agg, settings.optim.micro_batch_size
    count = aggregation_count(mini.loss_mask, agg)  # the mini-batch's, for every micro
    parts, finite, work = [], True, 0.0
    on_policy = mini.old_logprobs is None  # filled in by the micro-batches' forwards
    if on_policy:
        mini.old_logprobs = torch.zeros_like(mini.loss_mask)
    for index, (rows, micro) in enumerate(mini.split(size)):
        # every learner's: the whole mini-batch's
        work += micro_batch_flops(models, micro, settings.optim.detach_context)
        if sync is not None and not sync.owns(index):
            continue
        if on_policy:
            micro.old_logprobs = None
        loss, metrics = actor_loss(models, micro, settings, count)
        if on_policy:
            mini.old_logprobs[rows, : micro.old_logprobs.shape[1]] = micro.old_logprobs
        if models.critic is not None:
            closs, cmetrics = critic_loss(models, micro, settings.algorithm, count)
            loss = loss + closs
            metrics.update(cmetrics)
        finite = finite and bool(torch.isfinite(loss))
        loss.backward()
        parts.append((index, float(micro.loss_mask.sum()), metrics))
    if sync is not None:
        sync.sum_gradients(_trained_parameters(models))
        if on_policy:  # each row was filled by exactly one learner, zeros elsewhere
            sync.sum_(mini.old_logprobs)
        finite = sync.all_true(finite)
        parts = sorted((p for shard in sync.gather(parts) for p in shard), key=lambda p: p[0])
    merged = _merge([(weight, metrics) for _, weight, metrics in parts])
    return {**merged, UPDATE_FLOPS: work}, finite


def update_speed(work: float, seconds: float, models: TrainModels) -> dict[str, float]:
    """`perf/update_gflops`: `work` (the update's FLOPs, `UPDATE_FLOPS`) per second of the
    update stage; `perf/update_peak_share`: its share of the matmul peak in the dtype the
    update computes in (`perf/matmul_peak_gflops`, measured once per process)."""
    if work <= 0 or seconds <= 0:
        return {}
    peak, _ = flops.peak_of(models.actor, models.precision)
    speed = flops.utilisation(work, seconds, peak)
    return {
        "perf/update_gflops": speed["gflops"],
        "perf/update_peak_share": speed["peak_share"],
        "perf/matmul_peak_gflops": peak,
    }


def prompt_of_rows(batch: TrainBatch) -> torch.Tensor:
    """(B,) CPU index of each row's prompt, in order of first appearance (`prompt_clusters`)."""
    prompt = torch.zeros(len(batch), dtype=torch.long)
    for index, cluster in enumerate(prompt_clusters(batch)):
        prompt[cluster.rows.cpu()] = index
    return prompt


def _trained_parameters(models: TrainModels) -> list[torch.nn.Parameter]:
    """Every parameter an update changes: the actor's and the critic's (when there is one)."""
    modules = [m for m in (models.actor, models.critic) if m is not None]
    return [p for m in modules for p in trainable_parameters(m)]


def _grad_norm(models: TrainModels, clip: float) -> dict[str, float]:
    norms = {}
    for name, module in (("actor", models.actor), ("critic", models.critic)):
        if module is not None:
            params = trainable_parameters(module)
            norms[f"{name}/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, clip))
    return norms


def ppo_update(
    batch: TrainBatch,
    models: TrainModels,
    optimizers: Optimizers,
    settings: UpdateSettings,
    generator: torch.Generator,
    skips: SkipCounter | None = None,
    sync: DataParallel | None = None,
) -> dict[str, float]:
    """`ppo_epochs` passes over the batch in shuffled mini-batches; returns mean metrics of
    the applied updates. `sync`: this learner's share of data-parallel training (every
    learner calls this with the same batch and generator). An update whose loss or
    gradient norm is NaN/Inf is skipped (weights, optimizer state and schedule untouched),
    counted in `actor/skipped_steps`, and `skips` stops the run after too many in a row.

    `rollout/logprob_diff_*` (rollout vs training log-probs) is measured on the first
    mini-batch, before any update, when old log-probs are the rollout's; over the whole
    batch when they are recomputed. Recomputed old log-probs that `prepare` left to this
    function (None) are filled in by `fill_old_logprobs` and the first mini-batch's own
    forward; the batch holds all of them afterwards.
    """
    opt = settings.optim
    skips = skips or SkipCounter(opt.max_skipped_updates)
    sums: dict[str, list[float]] = defaultdict(list)
    skipped, mismatch_of_batch, work = 0, {}, 0.0
    pending = batch.old_logprobs is None  # recomputed old log-probs, left by `prepare`
    # `prepare` hands over the rollout's own tensor when they are the old policy's
    old_are_rollouts = batch.old_logprobs is batch.rollout_logprobs
    prompts = prompt_of_rows(batch)
    for epoch in range(opt.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for start in range(0, len(batch), opt.mini_batch_size):
            rows = order[start : start + opt.mini_batch_size]
            # Rows sorted by prompt, then group (a group shares a prompt; several groups
            # do where their seeds give the same one): a micro-batch then encodes each
            # prompt once (the mini-batch gradient is the same sum). The sort keys come
            # back to the CPU, where `rows` lives, on any device.
            rows = rows[torch.argsort(batch.group_ids[rows].cpu(), stable=True)]
            rows = rows[torch.argsort(prompts[rows], stable=True)]
            mini = batch.select(rows)
            if pending:  # the first mini-batch: the others' old log-probs up front
                fill_old_logprobs(batch, rows, models, settings)
                mini.old_logprobs = None
            metrics, finite = accumulate_gradients(mini, models, settings, sync)
            work += metrics.pop(UPDATE_FLOPS, 0.0)  # done even when the update is skipped
            if pending:  # now every row has its old log-probs
                mismatch_of_batch, pending = keep_old_logprobs(batch, rows, mini), False
            metrics.update(_grad_norm(models, opt.grad_clip))
            mismatch = {k: metrics.pop(k) for k in list(metrics) if k.startswith("rollout/")}
            if not (finite and all(math.isfinite(v) for v in metrics.values())):
                optimizers.zero_grad()  # nothing of this mini-batch reaches the weights
                skipped += 1
                skips.record(True)
                continue
            optimizers.step()
            optimizers.zero_grad()
            skips.record(False)
            if epoch == 0 and start == 0 and old_are_rollouts:
                metrics.update(mismatch)  # old log-probs are the rollout's: a true mismatch
            for key, value in metrics.items():
                sums[key].append(value)
    out = {key: sum(values) / len(values) for key, values in sums.items()}
    out.update(mismatch_of_batch)  # recomputed old vs rollout log-probs, all rows
    out["actor/skipped_steps"] = float(skipped)
    out[UPDATE_FLOPS] = work
    return out
