"""Training configuration: dataclasses with help text, YAML presets, dotted overrides.

A config is built in layers: the dataclass defaults, then a YAML file (which may inherit
from another file through a top-level `base: other.yaml`), then `section.key=value`
overrides from the command line. Every load is checked; each mistake raises one
`UserError` line that names the key and says what to change.

Only stdlib and yaml here: `starpo train --help` must not pay for importing torch.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import operator
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from starpo.defaults import DEFAULT_MODEL
from starpo.errors import UserError, closest_match

# --------------------------------------------------------------------------- fields


def _f(default: Any, help: str, **rules: Any) -> Any:
    """A config field: default, help text, and rules (choices, gt/ge/lt/le, example, and
    `why`: the reason a bound exists, shown when it is broken)."""
    meta = {"help": help, **rules}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def _section(cls: type, help: str) -> Any:
    return field(default_factory=cls, metadata={"help": help})


class _Section:
    """Checks shared by every section: types first, then declared ranges and choices."""

    _prefix: ClassVar[str] = ""  # dotted position in messages, e.g. "optim"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Coerce and check every field (sections recursively); raise UserError on a mistake."""
        hints = _hints(type(self))
        for f in fields(self):  # type: ignore[arg-type]
            key = f"{self._prefix}.{f.name}" if self._prefix else f.name
            example = f.metadata.get("example", None if f.default is MISSING else f.default)
            value = _coerce(getattr(self, f.name), hints[f.name], key, example)
            setattr(self, f.name, value)
            if isinstance(value, _Section):
                value.validate()
            _check_rules(value, f.metadata, key, example)
        self._check()

    def _check(self) -> None:
        """Checks that involve several fields; sections override this."""


# -------------------------------------------------------------------------- sections


@dataclass
class LoraConfig(_Section):
    _prefix = "model.lora"

    enabled: bool = _f(False, "Train LoRA adapters instead of all weights (paper: same result).")
    rank: int = _f(64, "LoRA rank r.", ge=1)
    alpha: int = _f(64, "LoRA alpha; adapter scale = alpha / rank.", ge=1)
    dropout: float = _f(0.0, "Dropout on the adapter input.", ge=0.0, lt=1.0)
    target_modules: str = _f("all-linear", "all-linear, or module names such as q_proj,v_proj.")
    lr_multiplier: float = _f(10.0, "Adapter lr = optim.actor_lr x this (reference: x10).", gt=0.0)


@dataclass
class ModelConfig(_Section):
    _prefix = "model"

    name: str = _f(
        DEFAULT_MODEL, "Policy model: the embedded default, a local HF folder or a hub id."
    )
    critic_name: str | None = _f(
        None,
        "Model the critic starts from; null = model.name.",
        example="Qwen/Qwen2.5-0.5B-Instruct",
    )
    device: str = _f("cpu", "Where the models run: cpu, cuda or cuda:N.")
    dtype: str = _f(
        "auto",
        "Compute dtype. bf16: forwards run under torch.autocast in bf16 while trainable "
        "weights and optimizer state stay fp32 (frozen reference / LoRA base in bf16). "
        "auto = bf16 on a GPU that supports it, else fp32 (bf16 is very slow on CPU).",
        choices=("auto", "fp32", "bf16", "float32", "bfloat16"),
    )
    lora: LoraConfig = _section(LoraConfig, "LoRA adapters")
    gradient_checkpointing: bool = _f(False, "Recompute activations: less memory, more compute.")


@dataclass
class EnvConfig(_Section):
    _prefix = "env"

    id: str = _f("bandit", "Training environment id (see `starpo envs`).")
    kwargs: dict[str, Any] = _f({}, "Env constructor arguments.", example={"size": 6})
    val_id: str | None = _f(None, "Validation env id; null = env.id.", example="bandit-rev")
    val_kwargs: dict[str, Any] | None = _f(None, "Validation env arguments; null = env.kwargs.")

    def _check(self) -> None:
        if not self.id.strip():
            raise UserError(
                "env.id is empty; set an env id, e.g. env.id=bandit (see `starpo envs`)"
            )

    @property
    def validation_id(self) -> str:
        return self.id if self.val_id is None else self.val_id

    @property
    def validation_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs if self.val_kwargs is None else self.val_kwargs)


@dataclass
class RolloutConfig(_Section):
    _prefix = "rollout"

    num_groups: int = _f(8, "Env groups per step (distinct initial states).", ge=1)
    group_size: int = _f(16, "Rollouts per group; all share one seed.", ge=1)
    max_turns: int = _f(5, "Turns per episode at most.", ge=1)
    max_actions_per_turn: int = _f(5, "Actions one answer may hold (separated by ||).", ge=1)
    max_actions_per_traj: int = _f(
        10, "Valid actions per episode at most (invalid ones use none).", ge=1
    )
    max_new_tokens: int = _f(400, "Token budget of one turn's response.", ge=1)
    max_response_words: int = _f(100, "Response length the prompt asks for, in words.", ge=1)
    temperature: float = _f(
        1.0,
        "Sampling temperature of training rollouts, > 0: PPO needs the log-probs of the "
        "distribution it samples from (greedy is for validation: trainer.val_temperature=0).",
        gt=0.0,
        why="greedy rollouts cannot train: the PPO ratio needs the sampling distribution's "
        "log-probs; validation may be greedy with trainer.val_temperature=0",
    )
    top_p: float = _f(1.0, "Nucleus sampling mass of training rollouts.", gt=0.0, le=1.0)
    think: bool = _f(True, "Ask for <think>...</think> first; false = prompt ends with <answer>.")
    format_penalty: float = _f(
        -0.1, "Training reward of an unparsable turn or invalid action; 0 = none.", le=0.0
    )
    format_reward: float = _f(
        0.0,
        "Shaping bonus for a well-formed turn (think/answer structure parsed), whatever its "
        "action; helps small models that never follow the format. 0 = the paper.",
        ge=0.0,
    )
    train_seed_start: int = _f(10000, "Training seeds count up from here.", ge=0)
    stop_at_answer: bool = _f(True, "End a turn's generation at </answer>.")

    def settings_kwargs(self, *, temperature: float | None = None) -> dict[str, Any]:
        """Keyword arguments of `starpo.rollout.engine.RolloutSettings` (same names)."""
        skip = ("num_groups", "group_size", "train_seed_start")  # not per-episode settings
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        return out if temperature is None else {**out, "temperature": temperature}


@dataclass
class FilterConfig(_Section):
    _prefix = "filter"

    enabled: bool = _f(False, "StarPO-S: train only on the groups whose rewards vary most.")
    ratio: float = _f(
        0.25, "Groups kept: max(1, round_half_up(ratio x num_groups)).", gt=0.0, le=1.0
    )
    mode: str = _f(
        "top_std", "top_std (StarPO-S) or bottom_std (ablation).", choices=("top_std", "bottom_std")
    )


@dataclass
class AlgorithmConfig(_Section):
    _prefix = "algorithm"

    adv_estimator: str = _f(
        "gae",
        "gae: PPO with a critic; grpo: group-normalised reward; bi_level_gae: turn then token.",
        choices=("gae", "grpo", "bi_level_gae"),
    )
    gamma: float = _f(1.0, "GAE discount.", ge=0.0, le=1.0)
    lam: float = _f(1.0, "GAE lambda.", ge=0.0, le=1.0)
    gamma_turn: float = _f(0.95, "bi_level_gae: discount across turns.", ge=0.0, le=1.0)
    lam_turn: float = _f(1.0, "bi_level_gae: lambda across turns.", ge=0.0, le=1.0)
    gamma_token: float = _f(1.0, "bi_level_gae: discount within a turn.", ge=0.0, le=1.0)
    lam_token: float = _f(1.0, "bi_level_gae: lambda within a turn.", ge=0.0, le=1.0)
    whiten_advantages: bool = _f(True, "Whiten advantages over the masked tokens.")
    grpo_eps: float = _f(1e-6, "GRPO: (R - mean) / (std + grpo_eps).", gt=0.0)
    reward_placement: str = _f(
        "trajectory",
        "Reward on the last assistant token, or each turn's on that turn's last token "
        "(gae only: bi_level_gae always uses per-turn rewards, grpo the trajectory's).",
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
        choices=("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"),
    )
    entropy_coef: float = _f(0.001, "Entropy bonus coefficient.", ge=0.0)
    kl_coef: float = _f(0.0, "KL-to-reference coefficient; 0 = no reference model.", ge=0.0)
    kl_estimator: str = _f(
        "auto",
        "Schulman's KL estimators: k1 = log-ratio, k2, k3 (verl's low_var_kl). auto = k3 "
        "as a loss term, k1 in the reward. k1 as a loss has zero expected gradient: it "
        "regularises nothing.",
        choices=("auto", "k1", "k2", "k3"),
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
        "token's loss by min(pi_train_old / pi_rollout, tis_cap); needs recomputed old "
        "log-probs. null = off.",
        gt=0.0,
        example=2.0,
    )

    @property
    def kl_loss_estimator(self) -> str:
        """The estimator in use: `kl_estimator`, or for auto k1 in the reward, k3 as a loss."""
        if self.kl_estimator != "auto":
            return self.kl_estimator
        return "k1" if self.kl_in_reward else "k3"

    @property
    def uses_critic(self) -> bool:
        return self.adv_estimator in ("gae", "bi_level_gae")

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0


@dataclass
class OptimConfig(_Section):
    _prefix = "optim"

    actor_lr: float = _f(1e-6, "Actor learning rate (AdamW; see lr_schedule).", gt=0.0)
    critic_lr: float = _f(1e-5, "Critic learning rate.", gt=0.0)
    weight_decay: float = _f(0.01, "AdamW weight decay.", ge=0.0)
    betas: tuple[float, float] = _f((0.9, 0.999), "AdamW betas.")
    grad_clip: float = _f(1.0, "Clip the gradient norm to this.", gt=0.0)
    ppo_epochs: int = _f(1, "Policy updates per rollout batch; 1 = fully on-policy.", ge=1)
    mini_batch_size: int = _f(32, "Trajectories per optimizer step.", ge=1)
    micro_batch_size: int = _f(4, "Trajectories per forward/backward (memory only).", ge=1)
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


@dataclass
class TrainerConfig(_Section):
    _prefix = "trainer"

    total_steps: int = _f(200, "Training steps (rollout stage + update stage).", ge=1)
    val_every: int = _f(10, "Validate every N steps; 0 = never.", ge=0)
    val_seeds: int = _f(256, "Number of fixed validation seeds.", ge=1)
    val_seed_start: int = _f(123, "First validation seed.", ge=0)
    val_temperature: float = _f(0.5, "Validation sampling temperature (0 = greedy).", ge=0.0)
    val_group_size: int = _f(1, "Validation episodes per seed (pass@k up to this).", ge=1)
    val_before_train: bool = _f(True, "Validate once before the first step.")
    val_batch_size: int = _f(64, "Validation episodes generated together (memory).", ge=1)
    save_every: int = _f(10, "Checkpoint every N steps; 0 = only at the end.", ge=0)
    keep_checkpoints: int = _f(2, "Newest checkpoints kept on disk.", ge=1)
    log_trajectories: int = _f(8, "Trajectories per step written as JSONL samples.", ge=0)
    tensorboard: bool = _f(True, "Write TensorBoard event files.")
    wandb: bool = _f(False, "Log to Weights & Biases.")
    wandb_project: str = _f("starpo", "Weights & Biases project.")
    wandb_mode: str = _f(
        "offline", "Weights & Biases mode.", choices=("online", "offline", "disabled")
    )
    seed: int = _f(0, "Seed of torch and of sampling.", ge=0)
    num_threads: int | None = _f(
        None, "torch CPU threads; null = torch's default.", ge=1, example=2
    )
    on_collapse: str = _f(
        "warn",
        "When the collapse detector fires: warn, stop, or rollback to the last good checkpoint.",
        choices=("warn", "stop", "rollback"),
    )


@dataclass
class TrainConfig(_Section):
    """Everything `starpo train` needs, one section per concern."""

    preset: str | None = _f(None, "Name of the preset this config came from (informational).")
    model: ModelConfig = _section(ModelConfig, "the policy and critic models")
    env: EnvConfig = _section(EnvConfig, "the environment")
    rollout: RolloutConfig = _section(RolloutConfig, "rollout stage: groups, limits, sampling")
    filter: FilterConfig = _section(FilterConfig, "StarPO-S uncertainty filtering")
    algorithm: AlgorithmConfig = _section(AlgorithmConfig, "advantages and losses")
    optim: OptimConfig = _section(OptimConfig, "optimizer and batching")
    trainer: TrainerConfig = _section(TrainerConfig, "loop, validation, checkpoints, logging")

    @property
    def groups_kept_per_step(self) -> int:
        """All groups, or max(1, round_half_up(filter.ratio x num_groups)) when filtering.

        The same count as `starpo.algorithms.filtering.num_kept` (kept torch-free here; a
        test checks they agree).
        """
        n = self.rollout.num_groups
        if not self.filter.enabled:
            return n
        return max(1, min(n, math.floor(self.filter.ratio * n + 0.5 + 1e-9)))

    @property
    def trajectories_per_step(self) -> int:
        return self.groups_kept_per_step * self.rollout.group_size

    def _check(self) -> None:
        if self.algorithm.adv_estimator == "grpo" and self.rollout.group_size < 2:
            raise UserError(
                "algorithm.adv_estimator=grpo: GRPO normalises within a group; "
                "set rollout.group_size >= 2"
            )
        batch, mini = self.trajectories_per_step, self.optim.mini_batch_size
        if batch % mini:
            groups = f"{self.rollout.num_groups} groups"
            if self.filter.enabled:
                groups = f"{self.groups_kept_per_step} of {groups} kept by filter.ratio"
            raise UserError(
                f"optim.mini_batch_size={mini} does not divide the {batch} trajectories trained "
                f"per step ({groups} x rollout.group_size={self.rollout.group_size}); "
                f"e.g. optim.mini_batch_size={_divisor_below(batch, mini)}"
            )
        if self.algorithm.tis_cap is not None and self.algorithm.recompute_old_logprobs is False:
            raise UserError(
                "algorithm.tis_cap corrects the rollout/training mismatch and needs the old "
                "log-probs recomputed; set algorithm.recompute_old_logprobs=true (or null)"
            )
        micro = self.optim.micro_batch_size
        if mini % micro:
            raise UserError(
                f"optim.micro_batch_size={micro} does not divide optim.mini_batch_size={mini}; "
                f"e.g. optim.micro_batch_size={_divisor_below(mini, micro)}"
            )


def _divisor_below(n: int, limit: int) -> int:
    """The largest divisor of n that is at most `limit` (a fix that keeps the batch shape)."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


# ------------------------------------------------------------------ types and rules

_UNIONS = (typing.Union, types.UnionType)
_BOUNDS = {
    "gt": (operator.gt, ">"),
    "ge": (operator.ge, ">="),
    "lt": (operator.lt, "<"),
    "le": (operator.le, "<="),
}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and is_dataclass(tp)


class _Mismatch(Exception):
    """A value that does not fit a type; `_coerce` turns it into a UserError."""


def _coerce(value: Any, tp: Any, key: str, example: Any) -> Any:
    """`value` as type `tp`, or a UserError naming `key`.

    Only lossless conversions: int -> float, numeric text -> float (YAML 1.1 reads `1e-6`
    as text), list -> tuple. An int field rejects 1.5 and true; a bool field rejects 1.
    """
    try:
        return _convert(value, tp)
    except _Mismatch:
        fix = "" if example is None else f"; e.g. {key}={_yaml_text(example)}"
        raise UserError(
            f"config key '{key}' expects {_describe(tp)}, got {_show(value)}{fix}"
        ) from None


def _convert(value: Any, tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:  # only `X | None` is used
        return (
            None if value is None else _convert(value, next(a for a in args if a is not type(None)))
        )
    if tp is float and not isinstance(value, bool) and isinstance(value, (int, float, str)):
        try:  # text too: YAML 1.1 reads `1e-6` (no dot) as a string
            number = float(value)
        except (ValueError, OverflowError):
            raise _Mismatch from None
        if not math.isnan(number):
            return number
    if tp is bool and isinstance(value, bool) or tp is str and isinstance(value, str):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if origin is dict and isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    if origin is tuple and isinstance(value, (list, tuple)) and len(value) == len(args):
        return tuple(_convert(v, t) for v, t in zip(value, args, strict=True))
    if _is_section(tp) and isinstance(value, tp):
        return value
    raise _Mismatch


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return _describe(next(a for a in args if a is not type(None))) + " or null"
    if origin is dict:
        return "a mapping such as {size: 6}"
    if origin is tuple:
        return f"a list of {len(args)} numbers"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, "a section")


def _check_rules(value: Any, meta: Mapping[str, Any], key: str, example: Any) -> None:
    """Declared choices and bounds (skipped for null, which means 'off' or 'same as')."""
    if value is None:
        return
    choices = meta.get("choices")
    if choices and value not in choices:
        guess = closest_match(str(value), list(choices))
        hint = f"did you mean {key}={guess}?" if guess else f"e.g. {key}={choices[0]}"
        raise UserError(f"{key} must be one of {', '.join(choices)}, got {_show(value)}; {hint}")
    if any(rule in meta and not ok(value, meta[rule]) for rule, (ok, _) in _BOUNDS.items()):
        need = " and ".join(
            f"{sign} {meta[rule]}" for rule, (_, sign) in _BOUNDS.items() if rule in meta
        )
        why = f" ({meta['why']})" if "why" in meta else ""
        raise UserError(
            f"{key} must be {need}, got {_show(value)}{why}; e.g. {key}={_yaml_text(example)}"
        )


def _yaml_text(value: Any) -> str:
    """One line of YAML, as a user would type it after `key=`."""
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...")


def _show(value: Any, limit: int = 60) -> str:
    try:
        text = " ".join(_yaml_text(value).split())  # one line, whatever the value
    except yaml.YAMLError:
        text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Any) -> Any:
    """Dataclasses to dicts and tuples to lists: what yaml.safe_dump writes."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ------------------------------------------------------------- dicts and unknown keys


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Nested plain dict (sections -> mappings, tuples -> lists) of a config."""
    return _plain(cfg)


def config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """Build and validate a config from a nested mapping (any subset of keys)."""
    return _build(TrainConfig, data, "")


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, Mapping):
        what = f"config section '{prefix[:-1]}'" if prefix else "a config"
        first = next(f.name for f in fields(cls) if not _is_section(_hints(cls)[f.name]))
        raise UserError(
            f"{what} must be a mapping of keys (such as {prefix}{first}), got {_show(data)}"
        )
    names, kwargs = {f.name for f in fields(cls)}, {}
    for name, value in data.items():
        if name not in names:
            raise _unknown_key(cls, prefix, name)
        tp = _hints(cls)[name]
        kwargs[name] = (
            _build(tp, value, f"{prefix}{name}.") if _is_section(tp) else copy.deepcopy(value)
        )
    return cls(**kwargs)


def _unknown_key(cls: type, prefix: str, name: Any) -> UserError:
    """'unknown config key' with the most likely meant key: the same name in another
    section, else the closest name in this section, else the closest dotted key."""
    name, keys = str(name), [key for key, _, _ in config_help()]
    guess = next((k for k in keys if k.rsplit(".", 1)[-1] == name), None)
    if guess is None:
        local = closest_match(name, [f.name for f in fields(cls)])
        guess = prefix + local if local else closest_match(prefix + name, keys)
    hint = f"did you mean '{guess}'?" if guess else "`starpo train --help` lists every key"
    return UserError(f"unknown config key '{prefix}{name}'; {hint}")


def _merge(cls: type, base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: sections merge key by key; values (env.kwargs too) replace,
    so a preset that switches env.id does not inherit the old env's arguments."""
    out = dict(base)
    hints = _hints(cls)
    for key, value in over.items():
        tp = hints.get(key) if isinstance(key, str) else None
        if _is_section(tp) and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(tp, out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ------------------------------------------------------------------------ overrides


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `dotted.key=value` (value parsed as YAML) to a nested config dict."""
    key, sep, text = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"override {override!r} must look like KEY=VALUE, e.g. optim.actor_lr=1e-5")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text  # not YAML: keep the text; a non-string field then says what it expects
    _set_dotted(data, TrainConfig, key.split("."), value, text.strip(), "")


def _set_dotted(
    data: dict, cls: type, parts: list[str], value: Any, text: str, prefix: str
) -> None:
    name, rest = parts[0], parts[1:]
    key = prefix + name
    if name not in {f.name for f in fields(cls)}:
        raise _unknown_key(cls, prefix, name)
    tp, current = _hints(cls)[name], data.get(name)
    if _is_section(tp):
        if rest:
            data[name] = current if isinstance(current, dict) else {}
            _set_dotted(data[name], tp, rest, value, text, key + ".")
        elif isinstance(value, Mapping):
            data[name] = _merge(tp, current if isinstance(current, dict) else {}, value)
        else:
            raise UserError(
                f"config key '{key}' is a section; set one of its keys, "
                f"e.g. {key}.{fields(tp)[0].name}=..."
            )
    elif rest:
        sub = f"{{{'.'.join(rest)}: {text}}}" if typing.get_origin(tp) is dict else "VALUE"
        raise UserError(f"config key '{key}' has no sub-keys; write {key}={sub}")
    elif tp in (str, str | None) and isinstance(value, (bool, int, float)):
        data[name] = text  # `trainer.wandb_project=2024` means the text, not the number
    else:
        data[name] = value


# ---------------------------------------------------------------------- YAML files


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """Defaults, then the YAML file at `path` (with its `base:` chain), then `overrides`.

    `preset` becomes the file's stem unless the file sets it (as saved configs do).
    """
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        raw = _read_yaml(path)
        data = _with_base(raw, path, ())
        if "preset" not in raw:
            data["preset"] = path.stem
    for override in overrides:
        apply_override(data, override)
    return config_from_dict(data)


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write `cfg` as YAML; `load_config(path)` gives back an equal config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True)
    path.write_text(
        "# starpo training config (every key; see `starpo train --help`)\n" + body, encoding="utf-8"
    )


def _with_base(raw: dict[str, Any], path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    raw = dict(raw)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise UserError(
            f"config file '{path}': base must name a YAML file, "
            f"e.g. base: paper-base.yaml; got {_show(base)}"
        )
    chain = (*chain, path.resolve())
    base_path = path.parent / base
    if base_path.resolve() in chain:
        raise UserError(
            f"config file '{path}' inherits from itself through base: {base}; remove the loop"
        )
    parent = _with_base(_read_yaml(base_path, named_by=path), base_path, chain)
    return _merge(TrainConfig, parent, raw)


def _read_yaml(path: Path, named_by: Path | None = None) -> dict[str, Any]:
    where = f"config file '{path}'" + (f" (base: of '{named_by}')" if named_by else "")
    if not path.exists():
        siblings = [p.name for p in path.parent.glob("*.y*ml")] if path.parent.is_dir() else []
        guess = next(iter(difflib.get_close_matches(path.name, siblings, n=1, cutoff=0.8)), None)
        hint = f"; did you mean '{path.parent / guess}'?" if guess else ""
        raise UserError(f"{where} not found{hint}")
    if path.is_dir() or path.suffix.lower() not in (".yaml", ".yml"):
        raise UserError(
            f"{where} is not a YAML file; pass a .yaml preset, e.g. configs/bandit-starpo-s.yaml"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserError(f"{where} is not a text file; pass a .yaml preset") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise UserError(f"{where} is not valid YAML{line}: {problem}; fix that line") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(
            f"{where} must hold a mapping of sections (e.g. 'optim: "
            f"{{actor_lr: 1.0e-6}}'), got {_show(data)}"
        )
    return data


# ----------------------------------------------------------------------------- help


def config_help() -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML text, help) for every setting, in declaration order."""
    rows: list[tuple[str, str, str]] = []

    def walk(cls: type, prefix: str) -> None:
        for f in fields(cls):
            tp = _hints(cls)[f.name]
            if _is_section(tp):
                walk(tp, f"{prefix}{f.name}.")
                continue
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            choices = f.metadata.get("choices")
            listed = choices and all(c in f.metadata["help"] for c in choices)
            extra = f" One of: {', '.join(choices)}." if choices and not listed else ""
            rows.append((prefix + f.name, _yaml_text(default), f.metadata["help"] + extra))

    walk(TrainConfig, "")
    return rows


def format_config_help(width: int = 88) -> str:
    """Every key with its default and help, grouped by section (for an argparse epilog;
    use RawDescriptionHelpFormatter so argparse keeps the layout)."""
    section_help = {f.name: f.metadata["help"] for f in fields(TrainConfig)}
    lines = ["config keys (set them in the YAML file or as KEY=VALUE, e.g. optim.actor_lr=1e-5):"]
    current = None
    for key, default, help_text in config_help():
        section = key.split(".")[0] if "." in key else ""
        if section != current and section:
            lines.append(f"\n{section}: {section_help[section]}")
        current = section
        lines.append(f"  {key} = {default}")
        lines.append(
            textwrap.fill(help_text, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )
    return "\n".join(lines)
