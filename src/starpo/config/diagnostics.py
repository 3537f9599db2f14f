"""The collapse detector's settings: the `diagnostics:` section of the training config
(metric keys, smoothing and thresholds, each with its help text and bounds). It lives here,
beside the detector that reads it, and `starpo.config.TrainConfig` mounts it, so YAML
files and `diagnostics.key=value` overrides set it and a mistake is one line naming the key.
"""

from __future__ import annotations

from starpo.config.fields import ConfigSection
from starpo.config.fields import config_field as _f
from starpo.errors import UserError


class DiagnosticsConfig(ConfigSection):
    """The collapse detector (`starpo.diagnostics`): metric keys, smoothing, thresholds.

    Defaults were set on synthetic streams shaped like RAGEN's published curves (GRPO
    collapsing near step 20 on Bandit; PPO holding steady for 200 steps); see
    tests/diagnostics. Each signal is read from one metric key, the one the trainer logs it
    under. Every ratio is relative to a running peak.
    """

    _prefix = "diagnostics"

    # metric keys, one per signal (absent from a step's metrics: skipped); a `*` stands for
    # one key part, and the first matching key (sorted) is kept for the rest of the run
    reward_key: str = _f("train/*/reward", "Metric of the training reward.")
    success_key: str = _f("train/*/success", "Metric of the training success rate.")
    std_key: str = _f("rollout/in_group_std", "Metric of the in-group reward std.")
    zero_std_key: str = _f(
        "rollout/zero_std_groups", "Metric of the share of groups whose rewards are all equal."
    )
    entropy_key: str = _f("actor/entropy", "Metric of the policy entropy.")
    grad_key: str = _f("actor/grad_norm", "Metric of the actor gradient norm.")
    think_key: str = _f("train/*/mean_think_tokens", "Metric of the think length (tokens).")
    distinct_key: str = _f("diagnostics/distinct_2", "Metric of distinct-2 (diversity).")
    identical_key: str = _f(
        "diagnostics/identical_in_group", "Metric of the share of identical responses in a group."
    )
    answer_key: str = _f(
        "train/*/answer_overuse",
        "Metric of a decision task's answer overuse (the largest share of cases of other "
        "kinds that got one answer; invoice, support).",
    )
    retrieval_key: str = _f(
        "diagnostics/mi/first_turn/retrieval_acc",
        "Metric of the template-collapse probe's retrieval accuracy (see mi_every).",
    )
    chance_key: str = _f(
        "diagnostics/mi/first_turn/chance", "Metric of that retrieval accuracy's chance level."
    )
    # RAGEN-2's template-collapse probe (trainer/mi_probe.py)
    mi_every: int = _f(
        10,
        "Every this many steps, score a sample of the step's replies under every prompt of "
        "the sample and log the input-reply mutual information and retrieval accuracy "
        "(RAGEN-2's template collapse: reasoning that keeps its entropy but stops depending "
        "on the input); 0 = off.",
        ge=0,
    )
    mi_samples: int = _f(
        8,
        "(prompt, reply) pairs per probe sample, N: N x N forward rows per sample.",
        ge=2,
        why="one reply has no other prompt to be told apart from",
    )
    # smoothing and bookkeeping
    ema_alpha: float = _f(
        0.3, "EMA weight of a new value: ema = alpha x value + (1 - alpha) x ema.", gt=0.0, le=1.0
    )
    min_steps: int = _f(5, "Warm-up: no alert during the first min_steps updates.", ge=1)
    window: int = _f(10, "State = the worst severity among alerts of the last window steps.", ge=1)
    trend_steps: int = _f(
        5, "'Rising' and 'falling' compare an EMA with its value this many steps back.", ge=1
    )
    noise_window: int = _f(50, "Raw rewards kept to estimate the reward's step noise.", ge=1)
    # (a) reward-std collapse
    std_drop_ratio: float = _f(
        0.3,
        "reward_std rule: in-group reward std EMA below this x its peak while the reward "
        "is not rising.",
        ge=0.0,
    )
    reward_rise_tol: float = _f(
        0.05, "'Not rising': the reward EMA gained <= this x the std peak over trend_steps.", ge=0.0
    )
    zero_std_collapse: float = _f(
        0.8, "reward_std rule: a collapse when the zero-std-group EMA is above this.", ge=0.0
    )
    # (b) entropy falls fast
    entropy_drop_ratio: float = _f(
        0.3, "entropy rule: entropy EMA below this x its peak ...", ge=0.0
    )
    entropy_rate: float = _f(
        0.05, "... or falling faster than this relative drop per step (over trend_steps).", ge=0.0
    )
    # (c) gradient-norm spike
    grad_z: float = _f(
        4.0,
        "grad_spike rule: gradient-norm z-score against the running window above this ...",
        gt=0.0,
    )
    grad_min_ratio: float = _f(3.0, "... and the norm at least this x the running mean.", ge=0.0)
    grad_window: int = _f(20, "Gradient norms in the running mean and std.", ge=1)
    grad_min_history: int = _f(
        5, "No z-score before this many gradient norms.", ge=2, why="a std needs two values"
    )
    grad_std_floor: float = _f(
        0.1, "The std used is at least this x the mean (quiet runs).", ge=0.0
    )
    grad_repeat_steps: int = _f(
        10, "A second spike this close while the reward falls is a collapse.", ge=1
    )
    # (d) think length collapses
    think_drop_ratio: float = _f(
        0.3, "think rule: think-length EMA below this x its peak ...", ge=0.0
    )
    think_min_peak: float = _f(10.0, "... once that peak was at least this (tokens).", ge=0.0)
    # (e) diversity collapses
    distinct_drop_ratio: float = _f(
        0.4, "diversity rule: distinct-2 EMA below this x its peak ...", ge=0.0
    )
    distinct_min_peak: float = _f(0.2, "... once that peak was at least this.", ge=0.0)
    identical_warn: float = _f(
        0.5, "diversity rule: a warning when the identical-in-group EMA is above this ...", ge=0.0
    )
    identical_collapse: float = _f(0.9, "... a collapse above this ...", ge=0.0)
    identical_rise: float = _f(
        0.3, "... and only after it rose this much above its lowest EMA.", ge=0.0
    )
    # (g) template collapse (RAGEN-2)
    template_acc_margin: float = _f(
        0.1,
        "template rule: retrieval accuracy EMA above chance by at most this share of the "
        "way from chance to 1 ...",
        ge=0.0,
        le=1.0,
    )
    template_entropy_ratio: float = _f(
        0.5, "... while the entropy EMA stays above this x its peak.", ge=0.0
    )
    # (h) a decision task's answers collapse onto one label
    answer_warn: float = _f(
        0.4,
        "answers rule: a warning when the answer-overuse EMA is above this ...",
        ge=0.0,
        le=1.0,
    )
    answer_collapse: float = _f(
        0.6, "... a collapse above this, with the reward clearly below its peak ...", ge=0.0, le=1.0
    )
    answer_rise: float = _f(
        0.2, "... and only after it rose this much above its lowest EMA.", ge=0.0
    )
    # a solved task may turn deterministic: that is convergence, not collapse
    solved_success: float = _f(
        0.9,
        "The narrowing rules (reward_std, entropy, think, diversity, template) stay quiet "
        "once the training success EMA reaches this ...",
        ge=0.0,
    )
    learning_rise: float = _f(
        0.05, "... and while the success EMA rises more than this over trend_steps.", ge=0.0
    )
    # (f) reward collapse
    reward_drop_frac: float = _f(
        0.3,
        "reward_collapse rule: reward EMA below its peak by this fraction of the rise to "
        "the peak ...",
        ge=0.0,
    )
    reward_noise_k: float = _f(
        4.0, "... with that rise and drop both above k x the reward's step noise.", ge=0.0
    )

    def signal_keys(self) -> dict[str, str]:
        """Signal name (as in `diagnostics.rules.Signals`) -> the metric key it is read from."""
        return {
            "success": self.success_key,
            "reward": self.reward_key,
            "std": self.std_key,
            "zero_std": self.zero_std_key,
            "entropy": self.entropy_key,
            "grad": self.grad_key,
            "think": self.think_key,
            "distinct": self.distinct_key,
            "identical": self.identical_key,
            "answers": self.answer_key,
            "retrieval": self.retrieval_key,
            "chance": self.chance_key,
        }

    def _check(self) -> None:
        for signal in ("identical", "answer"):
            warn, collapse = getattr(self, f"{signal}_warn"), getattr(self, f"{signal}_collapse")
            if warn > collapse:
                raise UserError(
                    f"diagnostics.{signal}_warn={warn} must be <= "
                    f"diagnostics.{signal}_collapse={collapse}; lower diagnostics.{signal}_warn"
                )
