"""The training config's `rollout` section: the per-episode settings, each declared as
`starpo.config.episode.EpisodeSettings` declares it (one definition), plus the settings
of a whole rollout stage (groups, seeds, workers, backend, dtype)."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Any

from starpo.config.episode import EpisodeSettings
from starpo.config.fields import ConfigSection
from starpo.config.fields import config_field as _f
from starpo.registry import GENERATION_BACKENDS

_EPISODE_SETTINGS = {f.name: f for f in dataclass_fields(EpisodeSettings)}


def _setting(name: str, help: str | None = None, **rules: Any) -> Any:
    """Config field `rollout.<name>` as `EpisodeSettings` (the one definition of the
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
    share_histories: bool = _f(
        False,
        "Episodes whose dialogues are so far the same read one KV-cache row (exact: each "
        "still samples with its own random draw). Pays where forks are cheap: one short "
        "turn (the Bandit demo's rollouts 14% faster); costs on long multi-turn histories "
        "with few duplicates (Sokoban: 2.1x slower, bench/bench_step.py).",
    )
    # Per-episode settings: defined once, in starpo.config.episode.EpisodeSettings.
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
    context_window: str = _setting("context_window")
    context_turns: int = _setting("context_turns")
    env_timeout_s: float = _setting("env_timeout_s")

    def settings(self, *, temperature: float | None = None) -> EpisodeSettings:
        """The per-episode settings of the rollout engine (another sampling temperature for
        validation)."""
        values = {name: getattr(self, name) for name in _EPISODE_SETTINGS}
        return EpisodeSettings(
            **(values if temperature is None else {**values, "temperature": temperature})
        )
