"""The training config's `rollout` section: the per-episode settings (it extends
`starpo.config.episode.EpisodeSettings`, where they are declared) plus the settings of a
whole rollout stage (groups, seeds, workers, backend, dtype)."""

from __future__ import annotations

from pydantic import ConfigDict

from starpo.config.episode import EpisodeSettings
from starpo.config.fields import config_field
from starpo.registry import GENERATION_BACKENDS


class RolloutConfig(EpisodeSettings):
    """The per-episode settings (`EpisodeSettings`, declared there once) and those of a
    whole rollout stage; unlike one episode's settings, a config may be edited."""

    model_config = ConfigDict(frozen=False)
    _prefix = "rollout"

    num_groups: int = config_field(8, "Env groups per step (distinct initial states).", ge=1)
    group_size: int = config_field(16, "Rollouts per group; all share one seed.", ge=1)
    train_seed_start: int = config_field(10000, "Training seeds count up from here.", ge=0)
    workers: int = config_field(
        0,
        "Ray rollout workers: each owns its envs and a replica of the policy, and plays a "
        "share of the env groups; 0 = in-process (no Ray). See the ray section.",
        ge=0,
    )
    backend: str = config_field(
        "auto",
        "Generation backend (starpo.registry.GENERATION_BACKENDS): hf = the training model's "
        "transformers forward with a KV cache per episode; lean = a lean decode loop for "
        "Llama-shaped models (preallocated KV cache, fused projections); auto = lean on a "
        "CPU when the model supports it, else hf.",
        choices=GENERATION_BACKENDS,
    )
    dtype: str = config_field(
        "auto",
        "Dtype rollouts decode in. auto = model.dtype's compute dtype, or bf16 on a CPU "
        "with native bf16 (AVX512-BF16/AMX), where decoding is ~2-3x faster. Not fp32: the "
        "trainer recomputes the PPO ratio's old log-probs (algorithm.recompute_old_logprobs) "
        "and logs the gap as rollout/logprob_diff_*.",
        choices=("auto", "fp32", "bf16", "float32", "bfloat16"),
    )
    kv_dtype: str = config_field(
        "fp32",
        "Dtype of the lean backend's KV cache. bf16 halves the bytes each decode step's "
        "attention reads (1.44x faster on a 2-core native-bf16 CPU, where decode attention "
        "is most of a long tool dialogue's rollout time; no faster on a 2-core AVX2-only "
        "CPU, where it is not bound by memory), at one more rounding of each key: "
        "inexact, so the trainer recomputes old log-probs. The hf backend's cache follows "
        "rollout.dtype.",
        choices=("fp32", "bf16", "float32", "bfloat16"),
    )
    share_histories: bool = config_field(
        False,
        "Episodes whose dialogues are so far the same read one KV-cache row (exact: each "
        "still samples with its own random draw). Pays where forks are cheap: one short "
        "turn (the Bandit demo's rollouts 14% faster); costs on long multi-turn histories "
        "with few duplicates (Sokoban: 2.1x slower, bench/bench_step.py).",
    )
    # Training samples: its own bound and help for the one per-episode setting it narrows.
    temperature: float = config_field(
        1.0,
        "Sampling temperature of training rollouts, > 0: PPO needs the log-probs of the "
        "distribution it samples from (greedy is for validation: trainer.val_temperature=0).",
        gt=0.0,
        why="greedy rollouts cannot train: the PPO ratio needs the sampling distribution's "
        "log-probs; validation may be greedy with trainer.val_temperature=0",
    )

    def settings(self, *, temperature: float | None = None) -> EpisodeSettings:
        """The per-episode settings of the rollout engine (another sampling temperature for
        validation)."""
        values = {name: getattr(self, name) for name in EpisodeSettings.model_fields}
        return EpisodeSettings(
            **(values if temperature is None else {**values, "temperature": temperature})
        )
