"""`DetectorConfig`: thresholds and metric keys of the collapse detector, with defaults.

Defaults were set on synthetic streams shaped like RAGEN's published curves (GRPO
collapsing near step 20 on Bandit; PPO holding steady for 200 steps); see
tests/diagnostics. Each metric is looked up under a tuple of candidate keys, the first
present wins, so both the trainer's names and `diagnostics/...` work.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DetectorConfig:
    """Configuration of `CollapseDetector`. Every ratio is relative to a running peak."""

    # --- metric keys (first key present in a step's metrics is used; absent -> skipped) ---
    reward_key: str | None = None  # None: first key matching `train/<env>/reward`
    std_keys: tuple[str, ...] = ("rollout/in_group_std", "diagnostics/reward_std")
    zero_std_keys: tuple[str, ...] = ("rollout/zero_std_groups", "diagnostics/zero_std_groups")
    entropy_keys: tuple[str, ...] = ("actor/entropy",)
    grad_keys: tuple[str, ...] = ("actor/grad_norm",)
    think_keys: tuple[str, ...] = ("diagnostics/think_length", "response_length/think_mean")
    distinct_keys: tuple[str, ...] = ("diagnostics/distinct_2",)
    identical_keys: tuple[str, ...] = ("diagnostics/identical_in_group",)

    # --- smoothing and bookkeeping ---
    ema_alpha: float = 0.3  # ema <- alpha * x + (1 - alpha) * ema
    min_steps: int = 5  # warm-up: no alert during the first `min_steps` updates
    window: int = 10  # state = worst severity among alerts of the last `window` steps
    trend_steps: int = 5  # "rising" / "falling" compare the EMA with its value this far back
    noise_window: int = 50  # raw reward values kept to estimate the reward's step noise

    # (a) reward-std collapse
    std_drop_ratio: float = 0.3  # std EMA below this fraction of its peak
    reward_rise_tol: float = 0.05  # "reward not rising": trend <= tol * std peak
    zero_std_collapse: float = 0.8  # ... and zero-std-group EMA above this -> collapse

    # (b) entropy falls fast
    entropy_drop_ratio: float = 0.3  # entropy EMA below this fraction of its peak
    entropy_rate: float = 0.05  # or relative EMA drop per step (mean over trend_steps)

    # (c) gradient-norm spike
    grad_z: float = 4.0  # z-score vs the running window's mean / std
    grad_min_ratio: float = 3.0  # and at least this multiple of the running mean
    grad_window: int = 20  # values in the running mean / std
    grad_min_history: int = 5  # no z-score before this many values
    grad_std_floor: float = 0.1  # std used is >= this fraction of the mean (quiet runs)
    grad_repeat_steps: int = 10  # a second spike this close while reward falls -> collapse

    # (d) think length collapses
    think_drop_ratio: float = 0.3  # think-length EMA below this fraction of its peak
    think_min_peak: float = 10.0  # only once the peak was meaningful (tokens)

    # (e) diversity collapses
    distinct_drop_ratio: float = 0.4  # distinct-2 EMA below this fraction of its peak
    distinct_min_peak: float = 0.2  # only once the peak was meaningful
    identical_warn: float = 0.5  # identical-in-group EMA above this -> warning
    identical_collapse: float = 0.9  # ... above this -> collapse
    identical_rise: float = 0.3  # ... and only after rising this much above its lowest EMA
    # A policy that solves this share of training episodes may turn deterministic: the
    # narrowing rules (reward_std, entropy, think, diversity) stay quiet (convergence).
    solved_success: float = 0.9
    # ... and so do they while the success EMA rises more than this over trend_steps.
    learning_rise: float = 0.05
    success_keys: tuple[str, ...] = ()  # () = the first key matching `train/<env>/success`

    # (f) reward collapse
    reward_drop_frac: float = 0.3  # EMA below peak by this fraction of the rise to the peak
    reward_noise_k: float = 4.0  # rise and drop must both exceed k * reward step noise

    def __post_init__(self) -> None:
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ValueError(f"ema_alpha must be in (0, 1], got {self.ema_alpha}")
        for name in ("min_steps", "window", "trend_steps", "grad_window", "noise_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.grad_min_history < 2:
            raise ValueError("grad_min_history must be >= 2 (a std needs two values)")
        if self.identical_warn > self.identical_collapse:
            raise ValueError("identical_warn must be <= identical_collapse; lower identical_warn")
