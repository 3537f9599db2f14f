"""Training configuration: the sections of `TrainConfig`, and its public API.

A config is built in layers: the defaults, then a YAML file (a preset shipped in
`starpo/configs/`, or any path; a file may inherit from another through a top-level
`base: other.yaml`), then `section.key=value` overrides from the command line. pydantic
checks types and bounds; each mistake becomes one `UserError` line that names the key and
says what to change.

This module owns what the settings are (fields with help, bounds, choices, and checks
across fields). The machinery is generic and lives beside it: `starpo.config_fields`
(field helpers, the section base class, one-line errors, the YAML dialect) and
`starpo.config_files` (YAML files, `base:`, presets, overrides, `--help` rows); the
functions at the end bind it to `TrainConfig` and `PRESETS_DIR`.

Only stdlib, yaml and pydantic here: `starpo train --help` must not pay for importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

import starpo.config_files as config_files
from starpo.config_fields import ConfigSection, config_root, plain, validated
from starpo.config_fields import config_field as _f
from starpo.config_fields import config_section as _section
from starpo.config_fields import field_rules as field_rules  # re-exported: public API
from starpo.config_fields import yaml_text as yaml_text  # re-exported: public API
from starpo.defaults import DEFAULT_MODEL, VALIDATION_SEED_START, VALIDATION_SEEDS
from starpo.diagnostics.settings import DiagnosticsConfig
from starpo.errors import UserError
from starpo.registry import (
    ADVANTAGE_ESTIMATORS,
    FILTER_MODES,
    GENERATION_BACKENDS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
)
from starpo.rollout.engine import RolloutSettings

PRESETS_DIR = Path(__file__).resolve().parent / "configs"  # shipped as package data

# -------------------------------------------------------------------------- sections


class LoraConfig(ConfigSection):
    _prefix = "model.lora"

    enabled: bool = _f(False, "Train LoRA adapters instead of all weights (paper: same result).")
    rank: int = _f(64, "LoRA rank r.", ge=1)
    alpha: int = _f(64, "LoRA alpha; adapter scale = alpha / rank.", ge=1)
    dropout: float = _f(0.0, "Dropout on the adapter input.", ge=0.0, lt=1.0)
    target_modules: str = _f("all-linear", "all-linear, or module names such as q_proj,v_proj.")
    lr_multiplier: float = _f(10.0, "Adapter lr = optim.actor_lr x this (reference: x10).", gt=0.0)


class ModelConfig(ConfigSection):
    _prefix = "model"

    name: str = _f(
        DEFAULT_MODEL, "Policy model: the embedded default, a local HF folder or a hub id."
    )
    device: str = _f("cpu", "Where the models run: cpu, cuda or cuda:N.")
    dtype: str = _f(
        "auto",
        "Compute dtype. bf16: forwards run under torch.autocast in bf16 while trainable "
        "weights and optimizer state stay fp32 (frozen reference / LoRA base in bf16). "
        "auto = bf16 on a GPU and on a CPU with native bf16 (AVX512-BF16 or AMX), fp32 on "
        "other CPUs, where bf16 is emulated and ~75x slower (rollouts pick their own, see "
        "rollout.dtype).",
        choices=("auto", "fp32", "bf16", "float32", "bfloat16"),
    )
    lora: LoraConfig = _section(LoraConfig, "LoRA adapters")
    gradient_checkpointing: bool = _f(False, "Recompute activations: less memory, more compute.")


class EnvConfig(ConfigSection):
    _prefix = "env"

    id: str = _f("bandit", "Training environment id (see `starpo envs`).")
    kwargs: dict[str, Any] = _f({}, "Env constructor arguments.", example={"size": 6})
    val_id: str | None = _f(None, "Validation env id; null = env.id.", example="bandit-rev")
    val_kwargs: dict[str, Any] | None = _f(None, "Validation env arguments; null = env.kwargs.")
    max_error_share: float = _f(
        0.25,
        "Stop the run when more than this share of a step's episodes hit an env error "
        "(raised or past rollout.env_timeout_s); below it, groups with an error are left "
        "out of the update and counted in rollout/env_errors.",
        ge=0.0,
        le=1.0,
    )

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


_EPISODE_SETTINGS = {f.name: f for f in dataclass_fields(RolloutSettings)}


def _setting(name: str, help: str | None = None, **rules: Any) -> Any:
    """Config field `rollout.<name>` as `RolloutSettings` (the one definition of the
    per-episode settings) declares it; `help`/`rules` given here replace its own."""
    declared = _EPISODE_SETTINGS[name]
    own = {k: v for k, v in declared.metadata.items() if k != "help"}
    return _f(declared.default, help or declared.metadata["help"], **(rules or own))


class RolloutConfig(ConfigSection):
    _prefix = "rollout"

    num_groups: int = _f(8, "Env groups per step (distinct initial states).", ge=1)
    group_size: int = _f(16, "Rollouts per group; all share one seed.", ge=1)
    train_seed_start: int = _f(10000, "Training seeds count up from here.", ge=0)
    workers: int = _f(
        0,
        "Ray rollout workers: each owns its envs and a replica of the policy, and plays a "
        "share of the env groups; 0 = in-process (no Ray). See the ray section.",
        ge=0,
    )
    backend: str = _f(
        "auto",
        "Generation backend (starpo.registry.GENERATION_BACKENDS): hf = the training model's "
        "transformers forward with a KV cache per episode; lean = a lean decode loop for "
        "Llama-shaped models (preallocated KV cache, fused projections); auto = lean on a "
        "CPU when the model supports it, else hf.",
        choices=GENERATION_BACKENDS,
    )
    dtype: str = _f(
        "auto",
        "Dtype rollouts decode in. auto = model.dtype's compute dtype, or bf16 on a CPU "
        "with native bf16 (AVX512-BF16/AMX), where decoding is ~2-3x faster. Not fp32: the "
        "trainer recomputes the PPO ratio's old log-probs (algorithm.recompute_old_logprobs) "
        "and logs the gap as rollout/logprob_diff_*.",
        choices=("auto", "fp32", "bf16", "float32", "bfloat16"),
    )
    # Per-episode settings: defined once, in starpo.rollout.engine.RolloutSettings.
    max_turns: int = _setting("max_turns")
    max_actions_per_turn: int = _setting("max_actions_per_turn")
    max_actions_per_traj: int = _setting("max_actions_per_traj")
    max_new_tokens: int = _setting("max_new_tokens")
    max_response_words: int = _setting("max_response_words")
    temperature: float = _setting(
        "temperature",
        "Sampling temperature of training rollouts, > 0: PPO needs the log-probs of the "
        "distribution it samples from (greedy is for validation: trainer.val_temperature=0).",
        gt=0.0,
        why="greedy rollouts cannot train: the PPO ratio needs the sampling distribution's "
        "log-probs; validation may be greedy with trainer.val_temperature=0",
    )
    top_p: float = _setting("top_p")
    think: bool = _setting("think")
    format_penalty: float = _setting("format_penalty")
    format_reward: float = _setting("format_reward")
    stop_at_answer: bool = _setting("stop_at_answer")
    format_every_turn: bool = _setting("format_every_turn")
    env_timeout_s: float = _setting("env_timeout_s")

    def settings(self, *, temperature: float | None = None) -> RolloutSettings:
        """The per-episode settings of the rollout engine (another sampling temperature for
        validation)."""
        values = {name: getattr(self, name) for name in _EPISODE_SETTINGS}
        return RolloutSettings(
            **(values if temperature is None else {**values, "temperature": temperature})
        )


class FilterConfig(ConfigSection):
    _prefix = "filter"

    enabled: bool = _f(False, "StarPO-S: train only on the groups whose rewards vary most.")
    ratio: float = _f(
        0.25, "Groups kept: max(1, round_half_up(ratio x num_groups)).", gt=0.0, le=1.0
    )
    mode: str = _f("top_std", "top_std (StarPO-S) or bottom_std (ablation).", choices=FILTER_MODES)


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


class TrainerConfig(ConfigSection):
    _prefix = "trainer"

    total_steps: int = _f(200, "Training steps (rollout stage + update stage).", ge=1)
    max_minutes: float | None = _f(
        None,
        "Budget of training minutes (rollout, update and saving; validation excluded), "
        "counted across --resume: the run stops after the step that reaches it, then "
        "validates, checkpoints and exports final/ as at total_steps (which still caps "
        "it). null = no budget.",
        gt=0.0,
        example=30,
    )
    val_every: int = _f(10, "Validate every N steps; 0 = never.", ge=0)
    val_seeds: int = _f(VALIDATION_SEEDS, "Number of fixed validation seeds.", ge=1)
    val_seed_start: int = _f(VALIDATION_SEED_START, "First validation seed.", ge=0)
    val_temperature: float = _f(0.5, "Validation sampling temperature (0 = greedy).", ge=0.0)
    val_group_size: int = _f(1, "Validation episodes per seed (pass@k up to this).", ge=1)
    val_before_train: bool = _f(True, "Validate once before the first step.")
    val_batch_size: int = _f(64, "Validation episodes generated together (memory).", ge=1)
    memory_check: bool = _f(
        True,
        "starpo train refuses a config whose estimated peak memory (starpo plan) exceeds "
        "the machine's; false skips the check.",
    )
    save_every: int = _f(10, "Checkpoint every N steps; 0 = only at the end.", ge=0)
    keep_checkpoints: int = _f(2, "Newest checkpoints kept on disk.", ge=1)
    checkpoint_contents: str = _f(
        "full",
        "What a checkpoint holds: full = trainable weights, AdamW moments, schedules, RNG "
        "(resume repeats an unbroken run exactly); weights = the same without AdamW moments "
        "(1/3 the size; a resume restarts the moments, so it is not exact).",
        choices=("full", "weights"),
    )
    checkpoint_async: bool = _f(
        False,
        "Write checkpoints in a background thread: the step waits only for a copy of the "
        "state (and for the previous write); resume stays exact. The copy is one more "
        "checkpoint's worth of host memory, kept for the run and reused by every save.",
    )
    log_trajectories: int = _f(8, "Trajectories per step written as JSONL samples.", ge=0)
    tensorboard: bool = _f(True, "Write TensorBoard event files.")
    wandb: bool = _f(False, "Log to Weights & Biases.")
    wandb_project: str = _f("starpo", "Weights & Biases project.")
    wandb_mode: str = _f(
        "offline", "Weights & Biases mode.", choices=("online", "offline", "disabled")
    )
    seed: int = _f(0, "Seed of torch and of sampling.", ge=0, le=2**63 - 1)  # torch's limit
    num_threads: int | None = _f(
        None, "torch CPU threads; null = torch's default.", ge=1, example=2
    )
    learners: int = _f(
        1,
        "Data-parallel learners: the driver plus N-1 Ray actors split each mini-batch's "
        "micro-batches and sum gradients with torch.distributed (gloo); one step equals one "
        "learner's on the same batch. CPU only so far.",
        ge=1,
    )
    on_collapse: str = _f(
        "warn",
        "When the collapse detector fires: warn, stop, or rollback to the last good checkpoint.",
        choices=("warn", "stop", "rollback"),
    )


class RayConfig(ConfigSection):
    _prefix = "ray"

    address: str | None = _f(
        None,
        "Ray cluster to join: auto = the one `ray start` runs on this machine, or "
        "HOST:PORT. null = start a local instance for the run and shut it down after.",
        example="auto",
    )
    num_cpus: int | None = _f(
        None, "CPUs of a local instance; null = this machine's.", ge=1, example=2
    )
    host: str = _f(
        "127.0.0.1",
        "Address a local instance and its ports listen on; another address exposes them "
        "to the network.",
    )
    dashboard: bool = _f(False, "Start Ray's dashboard (on ray.host) with a local instance.")


@config_root
class TrainConfig(ConfigSection):
    """Everything `starpo train` needs, one section per concern."""

    preset: str | None = _f(None, "Name of the preset this config came from (informational).")
    model: ModelConfig = _section(ModelConfig, "the policy and critic models")
    env: EnvConfig = _section(EnvConfig, "the environment")
    rollout: RolloutConfig = _section(RolloutConfig, "rollout stage: groups, limits, sampling")
    filter: FilterConfig = _section(FilterConfig, "StarPO-S uncertainty filtering")
    algorithm: AlgorithmConfig = _section(AlgorithmConfig, "advantages and losses")
    optim: OptimConfig = _section(OptimConfig, "optimizer and batching")
    trainer: TrainerConfig = _section(TrainerConfig, "loop, validation, checkpoints, logging")
    ray: RayConfig = _section(RayConfig, "the Ray cluster of rollout workers (rollout.workers)")
    diagnostics: DiagnosticsConfig = _section(
        DiagnosticsConfig, "the collapse detector: metric keys, smoothing, thresholds"
    )

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
        estimator = self.algorithm.adv_estimator
        facts = ADVANTAGE_ESTIMATORS.info(estimator)
        if facts.get("groups") and self.rollout.group_size < 2:
            raise UserError(
                f"algorithm.adv_estimator={estimator} normalises within a group; "
                "set rollout.group_size >= 2"
            )
        if self.algorithm.reward_placement == "per_turn" and not facts.get("rewards"):
            raise UserError(
                f"algorithm.reward_placement=per_turn has no effect with "
                f"adv_estimator={estimator}, which scores whole trajectories; remove it, or "
                "use gigpo (per-turn credit without a critic) or gae / bi_level_gae (with one)"
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
        learners = self.trainer.learners
        if learners > 1 and mini // micro < learners:
            raise UserError(
                f"trainer.learners={learners} split each mini-batch's micro-batches, but "
                f"optim.mini_batch_size={mini} / optim.micro_batch_size={micro} makes "
                f"{mini // micro}; {_fewer_per_micro(mini, learners)}"
            )
        if learners > 1 and self.model.device != "cpu":
            raise UserError(
                f"trainer.learners={learners} runs CPU learners (gloo) only so far; "
                f"model.device={self.model.device} needs trainer.learners=1"
            )
        if self.rollout.workers and self.model.device != "cpu":
            raise UserError(
                f"rollout.workers={self.rollout.workers} runs CPU workers only so far (GPU "
                f"workers are not built); model.device={self.model.device} needs "
                "rollout.workers=0"
            )
        if mini % micro:
            raise UserError(
                f"optim.micro_batch_size={micro} does not divide optim.mini_batch_size={mini}; "
                f"e.g. optim.micro_batch_size={_divisor_below(mini, micro)}"
            )


def _fewer_per_micro(mini: int, learners: int) -> str:
    """The fix for too few micro-batches per learner: smaller ones, or fewer learners."""
    if mini < learners:
        return f"set trainer.learners={mini} or fewer"
    return f"set optim.micro_batch_size={_divisor_below(mini, mini // learners)} or fewer learners"


def _divisor_below(n: int, limit: int) -> int:
    """The largest divisor of n that is at most `limit` (a fix that keeps the batch shape)."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


# ------------------------------------------------- the public API, bound to TrainConfig


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Nested plain dict (sections -> mappings, tuples -> lists) of a config."""
    return plain(cfg)


def config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """Build and validate a config from a nested mapping (any subset of keys)."""
    return validated(TrainConfig, data)


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one `dotted.key=value` (value parsed as YAML) to a nested config dict."""
    config_files.apply_override(TrainConfig, data, override)


def presets() -> list[str]:
    """Names of the presets shipped with starpo (`starpo train --config NAME`)."""
    return config_files.presets(PRESETS_DIR)


def resolve_config(name: str | Path) -> Path:
    """The YAML file `--config` names: an existing path, else a shipped preset by name
    (`cpu-tiny-smoke` or `cpu-tiny-smoke.yaml`). A missing path is left for `load_config`
    to report; an unknown bare name is a UserError listing the presets."""
    return config_files.resolve_config(PRESETS_DIR, name)


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """Defaults, then the YAML file at `path` or the preset it names (with its `base:`
    chain; a base may also name a shipped preset), then `overrides`. `preset` becomes the
    file's stem unless the file sets it (as saved configs do)."""
    return config_files.load_config(TrainConfig, PRESETS_DIR, path, overrides)


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write `cfg` as YAML; `load_config(path)` gives back an equal config."""
    config_files.save_config(cfg, path)


def config_help() -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML text, help) for every setting, in declaration order;
    the help ends with the choices and bounds it does not already state."""
    return config_files.config_help(TrainConfig)


def format_config_help(width: int = 88) -> str:
    """Every key with its default and help, grouped by section (for an argparse epilog;
    use RawDescriptionHelpFormatter so argparse keeps the layout)."""
    return config_files.format_config_help(TrainConfig, width)
