"""`starpo eval --policy model`: an LLM plays fixed validation seeds; metrics and summary."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starpo.evaluation import wilson_interval
from starpo.rollout.engine import RolloutEngine, RolloutSettings
from starpo.types import Trajectory


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k for one seed: P(at least one of k samples drawn from n succeeds)."""
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


@dataclass
class ModelEvalResult:
    trajectories: list[Trajectory]
    generation_seconds: float  # time inside the generation backend


def play_seeds(
    engine: RolloutEngine,
    env_id: str,
    seeds: list[int],
    samples_per_seed: int,
    *,
    batch_size: int,
    env_kwargs: dict[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> ModelEvalResult:
    """Play `samples_per_seed` episodes per seed, `batch_size` episodes per generation batch."""
    seeds_per_batch = max(1, batch_size // samples_per_seed)
    trajectories: list[Trajectory] = []
    generation_before = engine.generation_seconds
    for first in range(0, len(seeds), seeds_per_batch):
        batch = seeds[first : first + seeds_per_batch]
        trajectories.extend(engine.run(env_id, batch, samples_per_seed, env_kwargs=env_kwargs))
        if on_batch is not None:
            on_batch(len(batch) * samples_per_seed)
    return ModelEvalResult(trajectories, engine.generation_seconds - generation_before)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarise_trajectories(result: ModelEvalResult) -> dict[str, Any]:
    """Success with its 95% interval, pass@k, validity, turns, lengths, tokens/s."""
    trajs = result.trajectories
    turns = [turn for t in trajs for turn in t.turns]
    successes = sum(t.success for t in trajs)
    by_seed: dict[int, list[bool]] = defaultdict(list)
    for t in trajs:
        by_seed[t.seed].append(t.success)
    n = min(len(v) for v in by_seed.values()) if by_seed else 0
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, n) if 1 <= k <= n})
    pass_k = {
        f"pass@{k}": _mean([pass_at_k(len(v), sum(v), k) for v in by_seed.values()]) for k in ks
    }
    valid = sum(turn.num_valid for turn in turns)
    invalid = sum(turn.num_invalid for turn in turns)
    generated = sum(turn.response_tokens for turn in turns)
    low, high = wilson_interval(successes, len(trajs))
    return {
        "num_episodes": len(trajs),
        "success_rate": successes / len(trajs) if trajs else 0.0,
        "success_rate_ci95": [low, high],
        **pass_k,
        "mean_reward": _mean([t.env_reward for t in trajs]),
        "mean_train_reward": _mean([t.reward for t in trajs]),
        "mean_actions": _mean([t.num_actions for t in trajs]),
        "valid_action_rate": valid / (valid + invalid) if valid + invalid else 0.0,
        "format_ok_rate": _mean([float(turn.format_ok) for turn in turns]),
        "mean_turns": _mean([len(t.turns) for t in trajs]),
        "mean_response_tokens": _mean([turn.response_tokens for turn in turns]),
        "mean_think_tokens": _mean([turn.think_tokens for turn in turns]),
        "generated_tokens": generated,
        "generation_tokens_per_s": generated / result.generation_seconds
        if result.generation_seconds > 0
        else 0.0,
    }


def evaluate_model(
    env_id: str,
    model_name: str,
    seeds: list[int],
    settings: RolloutSettings,
    *,
    samples_per_seed: int = 1,
    batch_size: int = 32,
    device: str = "cpu",
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[ModelEvalResult, dict[str, Any]]:
    """Load `model_name`, play the seeds, and summarise."""
    from starpo.envs import make
    from starpo.models import load_model
    from starpo.rollout.hf_backend import HFBackend

    make(env_id, **(env_kwargs or {}))  # bad env ids and arguments fail before the model loads
    model, tokenizer = load_model(model_name, device=device)
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id, seed=seed)
    engine = RolloutEngine(backend, tokenizer, settings)
    result = play_seeds(
        engine,
        env_id,
        seeds,
        samples_per_seed,
        batch_size=batch_size,
        env_kwargs=env_kwargs,
        on_batch=on_batch,
    )
    return result, summarise_trajectories(result)
