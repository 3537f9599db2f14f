"""Training configuration: the sections of `TrainConfig`, and its public API.

A config is built in layers: the defaults, then a YAML file (a preset shipped in
`starpo/config/presets/`, or any path; a file may inherit from another through a top-level
`base: other.yaml`), then `section.key=value` overrides from the command line. pydantic
checks types and bounds; each mistake becomes one `UserError` line that names the key and
says what to change.

This module owns what the settings are (fields with help, bounds, choices, and checks
across fields). The machinery is generic and lives beside it: `starpo.config.fields`
(field helpers, the section base class, one-line errors, the YAML dialect) and
`starpo.config.files` (YAML files, `base:`, presets, overrides, `--help` rows); the
functions at the end bind it to `TrainConfig` and `PRESETS_DIR`.

Only stdlib, yaml and pydantic here: `starpo train --help` must not pay for importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import starpo.config.files as config_files
from starpo.config.algorithm import AlgorithmConfig, FilterConfig, OptimConfig
from starpo.config.curriculum import CurriculumConfig
from starpo.config.diagnostics import DiagnosticsConfig
from starpo.config.fields import ConfigSection, config_root, plain, validated
from starpo.config.fields import config_field as _f
from starpo.config.fields import config_section as _section
from starpo.config.fields import field_rules as field_rules  # re-exported: public API
from starpo.config.fields import yaml_text as yaml_text  # re-exported: public API
from starpo.config.rollout import RolloutConfig
from starpo.defaults import DEFAULT_MODEL, VALIDATION_SEED_START, VALIDATION_SEEDS
from starpo.errors import UserError
from starpo.registry import ADVANTAGE_ESTIMATORS, METRIC_SINKS

PRESETS_DIR = Path(__file__).resolve().parent / "presets"  # shipped as package data

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
    stop_at_success: float | None = _f(
        None,
        "Stop after a validation (trainer.val_every) whose success reaches this, then "
        "checkpoint and export final/ as at total_steps (which still caps the run); early "
        "stopping, kept across --resume. null = train to total_steps.",
        gt=0.0,
        le=1.0,
        example=0.95,
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
    keep_every: int = _f(
        0,
        "Also keep for good every checkpoint whose step is a multiple of N (0 = none): "
        "steps to evaluate or probe later with `starpo export`. Each costs a checkpoint's "
        "disk space.",
        ge=0,
    )
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
    sinks: list[str] = _f(
        [],
        "More metric sinks by name, beside metrics.jsonl: each gets every step's metrics "
        "(starpo.registry.METRIC_SINKS, or a package's starpo.metric_sinks entry point).",
        example=["tensorboard"],
    )
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

    def _check(self) -> None:
        for name in self.sinks:
            if name not in METRIC_SINKS:
                raise UserError(
                    f"trainer.sinks: unknown metric sink {name!r}; valid: "
                    f"{', '.join(METRIC_SINKS)} (or install a package that registers it "
                    "under the starpo.metric_sinks entry point)"
                )

    def sink_names(self) -> list[str]:
        """Every mirror sink the run writes: tensorboard / wandb when on, then `sinks`."""
        named = ["tensorboard"] * self.tensorboard + ["wandb"] * self.wandb + list(self.sinks)
        return list(dict.fromkeys(named))


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
    curriculum: CurriculumConfig = _section(
        CurriculumConfig, "pass-rate control: episodes that start part-way"
    )
    algorithm: AlgorithmConfig = _section(AlgorithmConfig, "advantages and losses")
    optim: OptimConfig = _section(OptimConfig, "optimizer and batching")
    trainer: TrainerConfig = _section(TrainerConfig, "loop, validation, checkpoints, logging")
    ray: RayConfig = _section(RayConfig, "the Ray cluster of rollout workers (rollout.workers)")
    diagnostics: DiagnosticsConfig = _section(
        DiagnosticsConfig, "the collapse detector: metric keys, smoothing, thresholds"
    )

    @property
    def groups_kept_per_step(self) -> int:
        """Groups trained on per step: all of them, or the filter's count: max(1,
        round_half_up(filter.ratio x num_groups)) (the same count as
        `starpo.algorithms.filtering.num_kept`, kept torch-free here; a test checks they
        agree), filter.top_k, or at most all of them when it varies (`filter.varies`)."""
        n, rule = self.rollout.num_groups, self.filter.rule
        if not self.filter.enabled or self.filter.varies:
            return n
        if rule == "top_k":
            return min(n, self.filter.top_k)
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
        if self.filter.enabled and self.filter.adaptive and self.filter.mode != "top_std":
            raise UserError(
                f"filter.rule={self.filter.rule} keeps the groups with the largest scores; "
                "set filter.mode=top_std, or use filter.rule=ratio or top_k with bottom_std"
            )
        if self.filter.varies and self.trainer.learners > 1:
            raise UserError(
                f"filter.rule={self.filter.rule} (or filter.keep_zero_std=false) keeps a "
                "different number of groups each step, which trainer.learners > 1 cannot "
                "split yet; use filter.rule=ratio or top_k with keep_zero_std=true, or one learner"
            )
        if batch % mini and not self.filter.varies:
            groups = f"{self.rollout.num_groups} groups"
            if self.filter.enabled:
                kept_by = f"filter.{self.filter.rule}"
                groups = f"{self.groups_kept_per_step} of {groups} kept by {kept_by}"
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
        if self.optim.detach_context and self.rollout.context_window != "full":
            raise UserError(
                f"optim.detach_context does not support rollout.context_window="
                f"{self.rollout.context_window} yet (rows of several sequences); set "
                "optim.detach_context=false or rollout.context_window=full"
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


def apply_changes(cfg: TrainConfig, changes: Mapping[str, Mapping[str, Any]]) -> None:
    """Set `{section: {key: value}}` on a live config (a collapse rollback's changes,
    which checkpoints carry and a resume applies again)."""
    for section, values in changes.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)


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
