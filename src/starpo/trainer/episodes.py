"""What the trainer reads from a step's episodes: their summary as metrics, the episodes
env errors ended (and when they stop the run), and StarPO-S's choice of the groups to
train on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starpo.algorithms.filtering import FilterRule, filter_groups, group_weights, loss_scale
from starpo.errors import UserError
from starpo.evaluation.model import ModelEvalResult
from starpo.stats import group_signal
from starpo.trainer.curriculum import GroupStart
from starpo.types import Trajectory, by_group


def rollout_metrics(prefix: str, result: ModelEvalResult) -> dict[str, float]:
    """The episode summary (`starpo.evaluation.summary.summarise`, the keys of `starpo eval`'s
    summary.json) under `prefix`: `train/<env>/success`, `val/<env>/success`, ..."""
    summary = result.summary()
    speed = summary.pop("generation_tokens_per_s")
    out = {f"{prefix}/{k}": float(v) for k, v in summary.items()}
    # A timing, so under perf/ (runs compare exactly on everything but timings).
    out[f"perf/{prefix.split('/')[0]}_generation_tokens_per_s"] = speed
    return out


def group_rewards(trajectories: list[Trajectory]) -> list[list[float]]:
    """Training rewards per env group, in group order (`by_group`)."""
    return [[t.reward for t in group] for group in by_group(trajectories).values()]


def signal_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """`signal/*`: where the step's learning signal is (`starpo.stats.group_signal`: the
    share of informative, all-failed and all-solved groups, and the mean group pass rate)."""
    groups = list(by_group(trajectories).values())
    rewards = [[t.reward for t in group] for group in groups]
    solved = [[t.success for t in group] for group in groups]
    return {f"signal/{k}": v for k, v in group_signal(rewards, solved).items()}


def untouched_groups(trajectories: list[Trajectory]) -> list[Trajectory]:
    """The trajectories of the groups no env error touched (an errored episode's outcome is
    not the policy's, and its group is left out of the update: see `check_env_errors`)."""
    errored = {t.group for t in trajectories if t.error is not None}
    return [t for t in trajectories if t.group not in errored]


def check_env_errors(trajectories: list[Trajectory], max_share: float, step: int) -> int:
    """The number of episodes an env error ended; a UserError when their share passes
    `max_share` or no group is left without one (nothing to train on)."""
    errors = [t for t in trajectories if t.error is not None]
    if not errors:
        return 0
    first = f"first: seed {errors[0].seed}, {errors[0].error}"
    if len(errors) > max_share * len(trajectories):
        raise UserError(
            f"env errors ended {len(errors)} of {len(trajectories)} episodes at step {step}, "
            f"above env.max_error_share={max_share:g} ({first}); fix the env, or raise "
            "env.max_error_share to train on the groups without errors"
        )
    if {t.group for t in errors} == {t.group for t in trajectories}:
        raise UserError(
            f"every env group had an env error at step {step} ({first}); nothing left "
            "to train on: fix the env"
        )
    return len(errors)


def step_seeds(cfg: Any, step: int) -> list[int]:
    """Training step `step`'s fresh seeds: rollout.train_seed_start on, num_groups a step."""
    first_seed = cfg.rollout.train_seed_start + (step - 1) * cfg.rollout.num_groups
    return list(range(first_seed, first_seed + cfg.rollout.num_groups))


def play_step(
    engine: Any, cfg: Any, step: int, starts: list[GroupStart] | None = None
) -> tuple[list[Trajectory], dict[str, float]]:
    """Play training step `step`'s env groups with `engine`: its fresh seeds
    (`step_seeds`), or where the curriculum planned them, each group's seed and start; the
    episodes and their metrics (env errors included, which stop the run past
    env.max_error_share; `signal/*` over the groups no env error touched)."""
    seeds = step_seeds(cfg, step) if starts is None else [g.seed for g in starts]
    where = None if starts is None else [g.start for g in starts]
    generating = engine.generation_seconds
    trajectories = engine.run(
        cfg.env.id, seeds, cfg.rollout.group_size, env_kwargs=cfg.env.kwargs, starts=where
    )
    generating = engine.generation_seconds - generating
    metrics = rollout_metrics(f"train/{cfg.env.id}", ModelEvalResult(trajectories, generating))
    metrics["rollout/env_errors"] = check_env_errors(trajectories, cfg.env.max_error_share, step)
    metrics.update(signal_metrics(untouched_groups(trajectories)))
    return trajectories, metrics


def filter_rule(filtering: Any) -> FilterRule:
    """The `FilterRule` of the config's filter section (every group when it is off)."""
    if not filtering.enabled:
        return FilterRule(rule="ratio", ratio=1.0, mode=filtering.mode)
    return FilterRule(
        rule=filtering.rule,
        ratio=filtering.ratio,
        top_k=filtering.top_k,
        top_p=filtering.top_p,
        min_p=filtering.min_p,
        shares=filtering.top_p_shares,
        metric=filtering.metric,
        mode=filtering.mode,
        keep_zero_std=filtering.keep_zero_std,
    )


@dataclass
class KeptGroups:
    """What the filter hands the update: the kept trajectories, the scale of each one's
    advantages (soft reweighting times the loss scale; None when all are 1) and the
    filter's metrics."""

    trajectories: list[Trajectory]
    advantage_weights: list[float] | None
    metrics: dict[str, float]


def keep_uncertain_groups(trajectories: list[Trajectory], filtering: Any) -> KeptGroups:
    """StarPO-S: the trajectories of the groups the filter keeps (all groups when
    `filtering.enabled` is off), with their advantage weights and the filter's metrics.
    Groups an env error touched are left out first (see `check_env_errors`)."""
    usable = untouched_groups(trajectories)
    result = filter_groups(group_rewards(usable), rule=filter_rule(filtering))
    groups = list(by_group(usable))  # group_rewards' order, the one filter_groups counts in
    kept = {groups[i] for i in result.kept}
    chosen = [t for t in usable if t.group in kept]
    metrics = {
        "rollout/in_group_std": result.std_all,
        "rollout/kept_in_group_std": result.std_kept,
        "rollout/zero_std_groups": result.zero_std_groups,
        "rollout/kept_groups": len(kept),
        "rollout/kept_trajectories": len(chosen),
    }
    weights = [1.0] * len(chosen)
    if filtering.soft_reweight:
        relative = dict(zip(groups, group_weights(result.group_std), strict=True))
        weights = [relative[t.group] for t in chosen]
        kept_weights = [relative[g] for g in kept] or [0.0]
        metrics["filter/weight_min"] = min(kept_weights)
        metrics["filter/weight_mean"] = sum(kept_weights) / len(kept_weights)
        metrics["filter/weight_max"] = max(kept_weights)
    if filtering.enabled and filtering.loss_scale != "none":
        scale = loss_scale(len(chosen) / len(usable), filtering.loss_scale)
        weights = [w * scale for w in weights]
        metrics["filter/loss_scale"] = scale
    unweighted = all(w == 1.0 for w in weights)
    return KeptGroups(chosen, None if unweighted else weights, metrics)
