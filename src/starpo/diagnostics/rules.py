"""The collapse rules: small pure functions of the detector's running history.

Every rule reads a `Signals` snapshot (EMAs, running peaks, short trends, grad-norm
z-score) and the config, and returns an `Alert` or None. The detector owns the
bookkeeping; rules never mutate anything, so each can be tested on a hand-built snapshot.
Order of the Echo Trap (RAGEN, arXiv 2504.20073): in-group reward std and entropy fall first, then
reward plateaus or drops with grad-norm spikes, reasoning shrinks, outputs repeat.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from starpo.config.diagnostics import DiagnosticsConfig

WARNING, COLLAPSE = "warning", "collapse"
SEVERITY_LEVEL = {"healthy": 0, WARNING: 1, COLLAPSE: 2}
EPS = 1e-8


@dataclass(frozen=True)
class Alert:
    """One rule firing at one step: the measured `value` crossed `threshold`."""

    step: int
    rule: str
    severity: str  # "warning" | "collapse"
    message: str
    value: float
    threshold: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class Signals:
    """Running history of the detector (JSON-serialisable, so checkpoints restore it).

    Signal names: success, reward, std, zero_std, entropy, think, distinct, identical,
    answers, retrieval, chance (EMAs), and grad (handled by the z-score fields instead of
    an EMA).
    """

    updates: int = 0
    keys: dict[str, str] = field(default_factory=dict)  # signal -> metric key, once found
    ema: dict[str, float] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)  # running max of each EMA
    low: dict[str, float] = field(default_factory=dict)  # running min of each EMA
    base: dict[str, float] = field(default_factory=dict)  # `low` when `peak` was last set
    trend: dict[str, list[float]] = field(default_factory=dict)  # last trend_steps+1 EMAs
    reward_raw: list[float] = field(default_factory=list)  # last noise_window raw rewards
    grad_history: list[float] = field(default_factory=list)  # clipped, last grad_window
    grad_z: float | None = None  # z-score of this step's grad norm (None: not measured)
    grad_ratio: float | None = None  # this step's grad norm / running mean
    spike_steps: list[int] = field(default_factory=list)  # recent spike steps
    first_warning_step: int | None = None
    recent: list[list] = field(default_factory=list)  # [step, rule, severity] in window


def window_mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and unbiased std by Welford's one-pass update (stable for large values)."""
    mean, m2 = 0.0, 0.0
    for count, x in enumerate(values, start=1):
        delta = x - mean
        mean += delta / count
        m2 += delta * (x - mean)
    n = len(values)
    return mean, math.sqrt(m2 / (n - 1)) if n > 1 else 0.0


def step_noise(values: list[float]) -> float:
    """Std of the per-step noise of a series: std(first differences) / sqrt(2).

    Differencing removes a linear trend (it only shifts the differences' mean), so a
    steadily rising reward does not count as noise; a change of trend inflates the
    estimate, which only makes the reward rules more conservative. 0.0 for < 3 values.
    """
    if len(values) < 3:
        return 0.0
    return float(np.std(np.diff(np.asarray(values, dtype=float)), ddof=1)) / math.sqrt(2.0)


def trend_delta(s: Signals, name: str) -> float | None:
    """EMA now minus the EMA `trend_steps` updates ago (None until two values exist)."""
    values = s.trend.get(name, [])
    return values[-1] - values[0] if len(values) > 1 else None


def below_peak(
    s: Signals, name: str, ratio: float, min_peak: float = 0.0
) -> tuple[float, float, float] | None:
    """(EMA, peak, threshold) when the EMA of `name` is below ratio x its running peak and
    the peak is meaningful (> EPS and >= min_peak); None otherwise."""
    value, peak = s.ema.get(name), s.peak.get(name, 0.0)
    if value is None or peak <= EPS or peak < min_peak:
        return None
    threshold = ratio * peak
    return (value, peak, threshold) if value < threshold else None


def reward_clearly_below_peak(s: Signals, cfg: DiagnosticsConfig) -> bool:
    """The reward EMA sits below its running peak by more than reward_noise_k x its noise."""
    reward, peak = s.ema.get("reward"), s.peak.get("reward")
    if reward is None or peak is None:
        return True  # no reward logged: repetition alone decides
    # EPS: a steady reward's EMA drifts from its peak by float rounding alone
    return peak - reward > max(cfg.reward_noise_k * step_noise(s.reward_raw), EPS)


def risen_share(
    s: Signals, cfg: DiagnosticsConfig, name: str, rise: float, warn: float, collapse: float
) -> tuple[float, bool, float] | None:
    """A share signal (`name`'s EMA) that rose at least `rise` above its lowest EMA and is
    above `warn`: (EMA, severe, threshold), severe when it is also above `collapse` while
    the reward is clearly below its peak (a policy that settled on its best answer repeats
    it too: that is no collapse); None otherwise. A share that started high (a two-armed
    bandit's replies, an agent that always leaned one way) is no new collapse."""
    value = s.ema.get(name)
    if value is None or value - s.low.get(name, value) < rise or value <= warn:
        return None
    severe = value > collapse and reward_clearly_below_peak(s, cfg)
    return value, severe, collapse if severe else warn


def rule_reward_std(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(a) In-group reward std EMA < std_drop_ratio * its peak while reward is not rising.

    "Not rising": the reward EMA gained at most reward_rise_tol * std peak over
    trend_steps (or no reward is logged). Collapse when also the zero-std-group EMA
    exceeds zero_std_collapse: most groups then give GRPO no signal at all.
    """
    hit = below_peak(s, "std", cfg.std_drop_ratio)
    if hit is None:
        return None
    std, peak, threshold = hit
    rise = trend_delta(s, "reward")
    if rise is not None and rise > cfg.reward_rise_tol * peak:
        return None
    zero = s.ema.get("zero_std")
    severe = zero is not None and zero > cfg.zero_std_collapse
    message = f"in-group reward std EMA {std:.3g} < {cfg.std_drop_ratio} x peak {peak:.3g}"
    if severe:
        message += f"; zero-std groups {zero:.2f} > {cfg.zero_std_collapse}"
    return Alert(step, "reward_std", COLLAPSE if severe else WARNING, message, std, threshold)


def rule_entropy(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(b) Entropy EMA < entropy_drop_ratio * its peak, or it falls faster than
    entropy_rate (relative drop per step, averaged over the last trend_steps). Warning."""
    hit = below_peak(s, "entropy", cfg.entropy_drop_ratio)
    if hit is not None:
        ent, peak, threshold = hit
        message = f"entropy EMA {ent:.3g} < {cfg.entropy_drop_ratio} x peak {peak:.3g}"
        return Alert(step, "entropy", WARNING, message, ent, threshold)
    values = s.trend.get("entropy", [])
    if len(values) < 2 or values[0] <= EPS:
        return None
    rate = (values[0] - values[-1]) / values[0] / (len(values) - 1)
    if rate > cfg.entropy_rate:
        message = f"entropy EMA falls {rate:.1%} per step (> {cfg.entropy_rate:.1%})"
        return Alert(step, "entropy", WARNING, message, rate, cfg.entropy_rate)
    return None


def rule_grad_spike(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(c) Grad norm z-score > grad_z (and > grad_min_ratio x the running mean). Warning;
    collapse when another spike came within grad_repeat_steps and the reward EMA fell
    over the last trend_steps."""
    if not s.spike_steps or s.spike_steps[-1] != step or s.grad_z is None:
        return None
    repeated = any(0 < step - t <= cfg.grad_repeat_steps for t in s.spike_steps[:-1])
    fall = trend_delta(s, "reward")
    severe = repeated and fall is not None and fall < 0
    message = f"grad-norm z-score {s.grad_z:.1f} > {cfg.grad_z} ({s.grad_ratio:.1f}x mean)"
    if severe:
        message += f"; repeated within {cfg.grad_repeat_steps} steps while reward falls"
    return Alert(step, "grad_spike", COLLAPSE if severe else WARNING, message, s.grad_z, cfg.grad_z)


def rule_think(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(d) Think-length EMA < think_drop_ratio * its peak, once the peak exceeded
    think_min_peak tokens (runs without thinking never alert). Warning."""
    hit = below_peak(s, "think", cfg.think_drop_ratio, cfg.think_min_peak)
    if hit is None:
        return None
    think, peak, threshold = hit
    message = f"think length EMA {think:.3g} < {cfg.think_drop_ratio} x peak {peak:.3g} tokens"
    return Alert(step, "think", WARNING, message, think, threshold)


def rule_diversity(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(e) Identical-in-group EMA > identical_warn (warning) / identical_collapse
    (collapse, when the reward is also clearly below its peak), once it has risen by
    identical_rise above its lowest level (a task whose answers are always alike, such as
    a two-armed bandit, starts high and is no collapse); or distinct-2 EMA <
    distinct_drop_ratio * its peak once the peak exceeded distinct_min_peak (warning)."""
    hit = risen_share(
        s, cfg, "identical", cfg.identical_rise, cfg.identical_warn, cfg.identical_collapse
    )
    if hit is not None:
        ident, severe, threshold = hit
        message = f"identical responses in group EMA {ident:.2f} > {threshold}"
        return Alert(step, "diversity", COLLAPSE if severe else WARNING, message, ident, threshold)
    hit = below_peak(s, "distinct", cfg.distinct_drop_ratio, cfg.distinct_min_peak)
    if hit is None:
        return None
    dist, peak, threshold = hit
    message = f"distinct-2 EMA {dist:.3g} < {cfg.distinct_drop_ratio} x peak {peak:.3g}"
    return Alert(step, "diversity", WARNING, message, dist, threshold)


def rule_reward_collapse(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(f) Reward EMA fell below its peak by > reward_drop_frac of the rise to that peak.

    Both the rise (peak minus the lowest EMA before it) and the drop must exceed
    reward_noise_k x the reward's step noise, so noise alone never triggers. Collapse when
    an earlier step already warned (the Echo Trap's order), else a warning.
    """
    reward, peak = s.ema.get("reward"), s.peak.get("reward")
    if reward is None or peak is None:
        return None
    rise = peak - s.base.get("reward", peak)
    noise_floor = cfg.reward_noise_k * step_noise(s.reward_raw)
    threshold = peak - max(cfg.reward_drop_frac * rise, noise_floor)
    if rise <= max(noise_floor, EPS) or reward >= threshold:
        return None
    warned = s.first_warning_step is not None and s.first_warning_step < step
    message = f"reward EMA {reward:.3g} fell from peak {peak:.3g} (rise {rise:.3g})"
    return Alert(
        step, "reward_collapse", COLLAPSE if warned else WARNING, message, reward, threshold
    )


def rule_template(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(g) Template collapse (RAGEN-2): replies stop depending on their input while the
    policy stays as random as before, which the entropy rule cannot see.

    Fires when the probe's retrieval-accuracy EMA (`diagnostics.mi_every`) is above chance
    by at most template_acc_margin x (1 - chance), after at least two probes, while the
    entropy EMA is at least template_entropy_ratio x its peak (a policy whose entropy
    fell too is the entropy rule's case). Warning.
    """
    acc, chance, entropy = s.ema.get("retrieval"), s.ema.get("chance"), s.ema.get("entropy")
    if acc is None or chance is None or entropy is None or len(s.trend["retrieval"]) < 2:
        return None
    threshold = chance + cfg.template_acc_margin * (1.0 - chance)
    entropy_floor = cfg.template_entropy_ratio * s.peak["entropy"]
    if acc > threshold or entropy < entropy_floor:
        return None
    message = (
        f"retrieval accuracy EMA {acc:.3g} <= {threshold:.3g} (chance {chance:.3g}) while "
        f"entropy EMA {entropy:.3g} >= {cfg.template_entropy_ratio} x peak: replies no "
        "longer depend on the input"
    )
    return Alert(step, "template", WARNING, message, acc, threshold)


def rule_answers(s: Signals, cfg: DiagnosticsConfig, step: int) -> Alert | None:
    """(h) A decision task's answers collapse onto one label (invoice's reason, support's
    outcome): the answer-overuse EMA (`evaluation.summary.answer_overuse`: the largest
    share of the cases of other kinds that got one answer) above answer_warn, once it rose
    answer_rise above its lowest EMA (an agent that always leaned one way is no new
    collapse). A collapse above answer_collapse when the reward is also clearly below its
    peak. Entropy and repetition can miss this: the replies stay varied, only the
    decision in them narrows."""
    hit = risen_share(s, cfg, "answers", cfg.answer_rise, cfg.answer_warn, cfg.answer_collapse)
    if hit is None:
        return None
    overuse, severe, threshold = hit
    message = (
        f"answer overuse EMA {overuse:.2f} > {threshold}: one answer is taking over cases "
        "that call for others"
    )
    return Alert(step, "answers", COLLAPSE if severe else WARNING, message, overuse, threshold)


Rule = Callable[[Signals, DiagnosticsConfig, int], "Alert | None"]

# Rule name -> function; `diagnostics/alert/<name>` is logged for each.
RULES: dict[str, Rule] = {
    "reward_std": rule_reward_std,
    "entropy": rule_entropy,
    "grad_spike": rule_grad_spike,
    "think": rule_think,
    "diversity": rule_diversity,
    "reward_collapse": rule_reward_collapse,
    "template": rule_template,
    "answers": rule_answers,
}
