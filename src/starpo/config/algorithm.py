"""The training config's algorithm sections: StarPO-S filtering (`filter`), the advantage
estimator, PPO / GRPO loss and KL settings (`algorithm`), and the optimizer with its
batching (`optim`). `starpo.config` assembles them with the other sections into
`TrainConfig`; the field helpers come from `starpo.config.fields`."""

from __future__ import annotations

from typing import Any

from starpo.config.fields import ConfigSection
from starpo.config.fields import config_field as _f
from starpo.errors import UserError
from starpo.registry import ADVANTAGE_ESTIMATORS, FILTER_MODES, KL_ESTIMATORS, LOSS_AGGREGATIONS


class FilterConfig(ConfigSection):
    _prefix = "filter"

    enabled: bool = _f(False, "StarPO-S: train only on the groups whose rewards vary most.")
    rule: str = _f(
        "ratio",
        "How groups are kept, ranked by filter.metric (RAGEN-2: rollout_filter_strategy): "
        "ratio = the first max(1, round_half_up(ratio x num_groups)) (StarPO-S); top_k = "
        "the first filter.top_k; top_p = the fewest first groups whose shares of the total "
        "score reach filter.top_p; min_p = every group scoring >= filter.min_p x the best. "
        "top_p and min_p keep a different number of groups each step.",
        choices=("ratio", "top_k", "top_p", "min_p"),
    )
    ratio: float = _f(
        0.25,
        "rule=ratio: groups kept, max(1, round_half_up(ratio x num_groups)) (RAGEN-2: "
        "rollout_filter_value with top_k < 1, which rounds down).",
        gt=0.0,
        le=1.0,
    )
    top_k: int = _f(
        2, "rule=top_k: groups kept (RAGEN-2: rollout_filter_value >= 1 with top_k).", ge=1
    )
    top_p: float = _f(
        0.9,
        "rule=top_p: share of the total score the kept groups reach (RAGEN-2: "
        "rollout_filter_value with top_p; 1 with keep_zero_std keeps every group).",
        gt=0.0,
        le=1.0,
    )
    top_p_shares: str = _f(
        "linear",
        "rule=top_p: a group's share, score / total (linear) or softmax of the scores "
        "(RAGEN-2: rollout_filter_top_p_prob_mode).",
        choices=("linear", "softmax"),
    )
    min_p: float = _f(
        0.5,
        "rule=min_p: keep groups scoring >= min_p x the largest score (RAGEN-2: "
        "rollout_filter_value with min_p).",
        ge=0.0,
        le=1.0,
    )
    metric: str = _f(
        "std",
        "A group's score: its reward std (StarPO-S) or variance (RAGEN-2: "
        "rollout_filter_metric=reward_variance). Same order; top_p shares and the min_p "
        "bar differ.",
        choices=("std", "variance"),
    )
    mode: str = _f(
        "top_std",
        "Which end is kept (RAGEN-2: rollout_filter_type): top_std = the largest scores "
        "(StarPO-S), bottom_std = the smallest (an ablation; rule ratio or top_k).",
        choices=FILTER_MODES,
    )
    keep_zero_std: bool = _f(
        True,
        "Groups whose rewards do not vary may be kept (RAGEN-2: rollout_filter_include_zero)"
        "; false = never, and a step where no group varies trains on nothing.",
    )
    loss_scale: str = _f(
        "none",
        "Scale the kept trajectories' advantages by the kept share (linear) or its square "
        "root (sqrt), against few kept groups' noisy gradients (RAGEN-2: "
        "filter_loss_scaling).",
        choices=("none", "linear", "sqrt"),
    )
    soft_reweight: bool = _f(
        False,
        "Weight each group's advantages by its reward std over the largest group's (RAGEN-2:"
        " soft_advantage_reweight); applies with or without filter.enabled (dropping none).",
    )

    @property
    def adaptive(self) -> bool:
        """Whether `rule` sizes the kept set from the scores (top_p, min_p; the same set as
        `starpo.algorithms.filtering.ADAPTIVE_RULES`, kept torch-free here)."""
        return self.rule in ("top_p", "min_p")

    @property
    def varies(self) -> bool:
        """Whether the number of groups kept changes from step to step (then a step's last
        mini-batch may be smaller)."""
        return self.enabled and (self.adaptive or not self.keep_zero_std)


class AlgorithmConfig(ConfigSection):
    _prefix = "algorithm"

    adv_estimator: str = _f(
        "gae",
        "gae: PPO with a critic; grpo: group-normalised reward; bi_level_gae: turn then "
        "token, with a critic; gigpo: grpo plus step-level credit over recurring env states.",
        choices=ADVANTAGE_ESTIMATORS,
    )
    gamma: float = _f(1.0, "GAE discount.", ge=0.0, le=1.0)
    lam: float = _f(1.0, "GAE lambda.", ge=0.0, le=1.0)
    gamma_turn: float = _f(0.95, "bi_level_gae: discount across turns.", ge=0.0, le=1.0)
    lam_turn: float = _f(1.0, "bi_level_gae: lambda across turns.", ge=0.0, le=1.0)
    gamma_token: float = _f(1.0, "bi_level_gae: discount within a turn.", ge=0.0, le=1.0)
    lam_token: float = _f(1.0, "bi_level_gae: lambda within a turn.", ge=0.0, le=1.0)
    whiten_advantages: bool = _f(True, "Whiten advantages over the masked tokens.")
    grpo_eps: float = _f(1e-6, "GRPO, GiGPO: (R - mean) / (std + grpo_eps).", gt=0.0)
    norm_by_std: bool = _f(
        True,
        "grpo, gigpo: divide by the group's reward std; false = only centre (Dr. GRPO, "
        "GiGPO's mean-only variant).",
    )
    gamma_step: float = _f(
        0.95, "gigpo: discount of a turn's return to the episode's end.", ge=0.0, le=1.0
    )
    step_weight: float = _f(1.0, "gigpo: A = A_episode + step_weight x A_step (0 = GRPO).", ge=0.0)
    estimator_args: dict[str, Any] = _f(
        {},
        "An estimator's own parameters (a plugin's), passed as AdvantageParams.extra.",
        example={"scale": 0.5},
    )
    reward_placement: str = _f(
        "trajectory",
        "Reward on the last assistant token, or each turn's on that turn's last token "
        "(gae only: bi_level_gae and gigpo always use per-turn rewards, grpo the "
        "trajectory's).",
        choices=("trajectory", "per_turn"),
    )
    clip_low: float = _f(0.2, "PPO clip: ratio >= 1 - clip_low.", ge=0.0)
    clip_high: float = _f(0.28, "PPO clip: ratio <= 1 + clip_high (vanilla StarPO: 0.2).", ge=0.0)
    dual_clip: float | None = _f(
        3.0,
        "Dual-clip c > 1: a negative advantage's loss is capped at -A x c (verl's "
        "clip_ratio_c, always on in RAGEN); null = off.",
        gt=1.0,
        example=3.0,
    )
    loss_agg: str = _f(
        "token_mean",
        "token_mean: mean over all tokens; seq_mean_token_mean: mean per sequence, then over "
        "sequences; seq_mean_token_sum: sum per sequence, then mean over sequences. Means "
        "are over the whole mini-batch, whatever optim.micro_batch_size.",
        choices=LOSS_AGGREGATIONS,
    )
    entropy_coef: float = _f(0.001, "Entropy bonus coefficient.", ge=0.0)
    kl_coef: float = _f(0.0, "KL-to-reference coefficient; 0 = no reference model.", ge=0.0)
    kl_estimator: str = _f(
        "auto",
        "Schulman's KL estimators: k1 = log-ratio, k2, k3 (verl's low_var_kl). auto = k3 "
        "as a loss term, k1 in the reward. k1 as a loss has zero expected gradient: it "
        "regularises nothing.",
        choices=("auto", *KL_ESTIMATORS),
    )
    kl_in_reward: bool = _f(False, "Apply the KL as a reward penalty instead of a loss term.")
    value_clip: float = _f(0.5, "Critic value clip range.", gt=0.0)
    vf_coef: float = _f(1.0, "Critic loss coefficient.", ge=0.0)
    recompute_old_logprobs: bool | None = _f(
        None,
        "Recompute the PPO ratio's old log-probs with the training model after the rollout "
        "(as RAGEN/verl do) instead of using the rollout's; null = auto: on when rollout "
        "and training numerics differ (model.dtype bf16).",
        example=True,
    )
    tis_cap: float | None = _f(
        None,
        "Truncated importance sampling against the rollout/training mismatch: weight each "
        "token's loss by min(pi_train_old / pi_rollout, tis_cap); weights are 1 where the "
        "old log-probs are the rollout's (algorithm.recompute_old_logprobs off). null = off.",
        ge=1.0,
        example=2.0,
        why="a cap below 1 would scale down even the tokens whose rollout and training "
        "probabilities agree",
    )

    def advantage_params(self) -> dict[str, Any]:
        """The estimators' parameters (`starpo.algorithms.AdvantageParams` fields) from this
        section: the one place that maps config names to estimator names."""
        return {
            "gamma": self.gamma,
            "lam": self.lam,
            "gamma_turn": self.gamma_turn,
            "lam_turn": self.lam_turn,
            "gamma_token": self.gamma_token,
            "lam_token": self.lam_token,
            "eps": self.grpo_eps,
            "norm_by_std": self.norm_by_std,
            "gamma_step": self.gamma_step,
            "step_weight": self.step_weight,
            "whiten": self.whiten_advantages,
            "extra": dict(self.estimator_args),
        }

    @property
    def kl_loss_estimator(self) -> str:
        """The estimator in use: `kl_estimator`, or for auto k1 in the reward, k3 as a loss."""
        if self.kl_estimator != "auto":
            return self.kl_estimator
        return "k1" if self.kl_in_reward else "k3"

    @property
    def uses_critic(self) -> bool:
        return bool(ADVANTAGE_ESTIMATORS.info(self.adv_estimator).get("critic"))

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0


class OptimConfig(ConfigSection):
    _prefix = "optim"

    actor_lr: float = _f(1e-6, "Actor learning rate (AdamW; see lr_schedule).", gt=0.0)
    critic_lr: float = _f(1e-5, "Critic learning rate.", gt=0.0)
    weight_decay: float = _f(0.01, "AdamW weight decay.", ge=0.0)
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas.")
    grad_clip: float = _f(1.0, "Clip the gradient norm to this.", gt=0.0)
    ppo_epochs: int = _f(1, "Policy updates per rollout batch; 1 = fully on-policy.", ge=1)
    mini_batch_size: int = _f(32, "Trajectories per optimizer step.", ge=1)
    micro_batch_size: int = _f(4, "Trajectories per forward/backward (memory only).", ge=1)
    detach_context: bool = _f(
        False,
        "Approximate, cheaper update: gradient only through the tokens that predict the "
        "agent's tokens; the prompt's and observations' keys and values are constants "
        "(a multi-turn update ~2-3x cheaper; the log-probs do not change, the gradient does).",
    )
    lr_warmup_steps: int = _f(
        0, "Linear learning-rate warm-up over this many optimizer updates (0 = none).", ge=0
    )
    lr_schedule: str = _f(
        "constant",
        "After warm-up: constant (the paper) or cosine decay to min_lr_ratio x lr at the "
        "last update.",
        choices=("constant", "cosine"),
    )
    min_lr_ratio: float = _f(
        0.0, "cosine: final learning rate / base learning rate.", ge=0.0, le=1.0
    )
    max_skipped_updates: int = _f(
        5,
        "Stop the run after this many consecutive updates skipped for a non-finite "
        "(NaN/Inf) loss or gradient norm.",
        ge=1,
    )

    def _check(self) -> None:
        for i, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise UserError(
                    f"optim.betas[{i}] must be in [0, 1), got {beta}; e.g. [0.9, 0.999]"
                )
