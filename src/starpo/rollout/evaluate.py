"""`starpo eval --policy model`: an LLM plays fixed validation seeds (summarised by
`starpo.evaluation.summarise`, like every other set of episodes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starpo.evaluation import summarise
from starpo.rollout.engine import RolloutEngine, RolloutSettings
from starpo.types import Trajectory


@dataclass
class ModelEvalResult:
    trajectories: list[Trajectory]
    generation_seconds: float  # time inside the generation backend

    def summary(self) -> dict[str, Any]:
        """`starpo.evaluation.summarise` of the trajectories, with the generation speed."""
        return summarise(self.trajectories, generation_seconds=self.generation_seconds)


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


def evaluate_model(
    env_id: str,
    model_name: str,
    seeds: list[int],
    settings: RolloutSettings,
    *,
    samples_per_seed: int = 1,
    batch_size: int = 32,
    device: str = "cpu",
    backend: str = "auto",
    dtype: str = "auto",
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[ModelEvalResult, dict[str, Any]]:
    """Load `model_name`, play the seeds, and summarise."""
    from starpo.envs import make
    from starpo.models import load_model
    from starpo.models.precision import rollout_dtype
    from starpo.registry import GENERATION_BACKENDS, lookup

    make(env_id, **(env_kwargs or {}))  # bad env ids and arguments fail before the model loads
    build = lookup(GENERATION_BACKENDS, backend)
    model, tokenizer = load_model(model_name, device=device)
    compute_dtype = next(model.parameters()).dtype
    decode_dtype = rollout_dtype(dtype, compute_dtype, model.device)
    generator = build(model, tokenizer, compute_dtype=decode_dtype, seed=seed)
    engine = RolloutEngine(generator, tokenizer, settings)
    result = play_seeds(
        engine,
        env_id,
        seeds,
        samples_per_seed,
        batch_size=batch_size,
        env_kwargs=env_kwargs,
        on_batch=on_batch,
    )
    numerics = generator.numerics
    return result, {**result.summary(), "backend": numerics.name, "dtype": numerics.compute_dtype}
