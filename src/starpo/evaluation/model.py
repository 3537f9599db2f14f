"""`starpo eval --policy model`: an LLM plays fixed validation seeds (summarised by
`starpo.evaluation.summary.summarise`, like every other set of episodes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from starpo.config.episode import EpisodeSettings
from starpo.evaluation.summary import summarise
from starpo.rollout.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)
from starpo.rollout.engine import RolloutEngine
from starpo.types import Trajectory

#: A turn's token budget without a think block: the turn is only an answer (five actions
#: and </answer> are 12 tokens with the default tokenizer), and a model that rambles would
#: otherwise run every turn to the think-mode budget.
NO_THINK_MAX_NEW_TOKENS = 64


def default_max_new_tokens(think: bool) -> int:
    """The token budget of a turn when none is given: room to reason, or just to answer."""
    return (
        EpisodeSettings.model_fields["max_new_tokens"].default if think else NO_THINK_MAX_NEW_TOKENS
    )


@dataclass
class ModelEvalResult:
    trajectories: list[Trajectory]
    generation_seconds: float  # time inside the generation backend

    def summary(self) -> dict[str, Any]:
        """`starpo.evaluation.summary.summarise` of the trajectories, with the generation speed."""
        return summarise(self.trajectories, generation_seconds=self.generation_seconds)


@dataclass(frozen=True)
class EvalProgress:
    """Where an evaluation stands after one turn of generation (for a progress bar)."""

    turn: int  # the turn just played, within its batch of episodes
    max_turns: int
    episodes_done: int  # over all batches so far
    generated_tokens: int  # over all turns so far
    generation_seconds: float  # time inside the generation backend so far

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0


class _MeteredBackend:
    """A generation backend that counts what passes through it: the engine reports only
    the turn number, and a progress bar wants tokens and finished episodes too."""

    def __init__(self, backend: GenerationBackend) -> None:
        self.backend = backend
        self.generated_tokens = 0
        self.released = 0  # the engine releases each episode's session in the turn it ends

    def generate(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        generations = self.backend.generate(requests, params)
        self.generated_tokens += sum(len(g.token_ids) for g in generations)
        return generations

    def release(self, sessions: Iterable[int]) -> None:
        sessions = list(sessions)
        self.released += len(sessions)
        self.backend.release(sessions)

    def __getattr__(self, name: str) -> Any:  # reset, seed, numerics, ...: as they are
        return getattr(self.backend, name)


def play_seeds(
    engine: RolloutEngine,
    env_id: str,
    seeds: list[int],
    samples_per_seed: int,
    *,
    batch_size: int,
    env_kwargs: dict[str, Any] | None = None,
    on_turn: Callable[[int], None] | None = None,
) -> ModelEvalResult:
    """Play `samples_per_seed` episodes per seed, `batch_size` episodes per generation batch;
    `on_turn(turn)` after every turn of every batch."""
    seeds_per_batch = max(1, batch_size // samples_per_seed)
    trajectories: list[Trajectory] = []
    generation_before = engine.generation_seconds
    for first in range(0, len(seeds), seeds_per_batch):
        batch = seeds[first : first + seeds_per_batch]
        trajectories.extend(
            engine.run(env_id, batch, samples_per_seed, env_kwargs=env_kwargs, on_turn=on_turn)
        )
    return ModelEvalResult(trajectories, engine.generation_seconds - generation_before)


def load_generator(
    model_name: str,
    device: str = "cpu",
    backend: str = "auto",
    dtype: str = "auto",
    seed: int = 0,
    kv_dtype: str = "fp32",
) -> tuple[Any, Any, Any]:
    """(model, tokenizer, generation backend) of `model_name`, decoding in `dtype`
    (`rollout.dtype`'s rule) on `backend`, its cache in `kv_dtype` (`rollout.kv_dtype`):
    what `starpo eval --policy model` and `starpo serve` generate with. An unknown backend
    fails before the model loads."""
    import torch

    from starpo.models import load_model
    from starpo.models.loading import resolve_dtype
    from starpo.models.precision import rollout_dtype
    from starpo.registry import GENERATION_BACKENDS
    from starpo.rollout.backends.base import set_kv_dtype

    build = GENERATION_BACKENDS[backend]
    cache_dtype = resolve_dtype(kv_dtype, torch.device("cpu"))
    model, tokenizer = load_model(model_name, device=device)
    compute_dtype = next(model.parameters()).dtype
    decode_dtype = rollout_dtype(dtype, compute_dtype, model.device)
    generator = build(model, tokenizer, compute_dtype=decode_dtype, seed=seed)
    set_kv_dtype(generator, cache_dtype)
    return model, tokenizer, generator


def evaluate_model(
    env_id: str,
    model_name: str,
    seeds: list[int],
    settings: EpisodeSettings,
    *,
    samples_per_seed: int = 1,
    batch_size: int = 32,
    device: str = "cpu",
    backend: str = "auto",
    dtype: str = "auto",
    kv_dtype: str = "fp32",
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    on_turn: Callable[[EvalProgress], None] | None = None,
) -> tuple[ModelEvalResult, dict[str, Any]]:
    """Load `model_name`, play the seeds, and summarise; `on_turn` gets an `EvalProgress`
    after every turn."""
    from starpo.envs import make

    make(env_id, **(env_kwargs or {}))  # bad env ids and arguments fail before the model loads
    model, tokenizer, generator = load_generator(
        model_name, device, backend, dtype, seed, kv_dtype=kv_dtype
    )
    meter = _MeteredBackend(generator)
    engine = RolloutEngine(meter, tokenizer, settings)

    def report(turn: int) -> None:
        if on_turn is not None:
            progress = EvalProgress(
                turn,
                settings.max_turns,
                meter.released,
                meter.generated_tokens,
                engine.generation_seconds,
            )
            on_turn(progress)

    result = play_seeds(
        engine,
        env_id,
        seeds,
        samples_per_seed,
        batch_size=batch_size,
        env_kwargs=env_kwargs,
        on_turn=report,
    )
    numerics = generator.numerics
    described = {"backend": numerics.name, "dtype": numerics.compute_dtype}
    if numerics.cache_dtype:
        described["kv_dtype"] = numerics.cache_dtype
    return result, {**result.summary(), **described}


def progress_bar(total: int, desc: str, *, disable: bool = False) -> tuple[Any, Callable]:
    """A tqdm bar over `total` episodes and the `on_turn` callback of `evaluate_model` that
    moves it. Episodes drive the bar and its ETA; a batch of episodes takes several turns,
    so the postfix shows that turns and tokens move meanwhile. The bar opens at the first
    turn, so an error while the model loads (a bad device or model) is its one line with
    no empty bar above it, and the ETA leaves the loading time out."""
    from contextlib import contextmanager

    from tqdm import tqdm

    bars: list[Any] = []

    def show(progress: EvalProgress) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc=desc, unit="ep", disable=disable))
        bar = bars[0]
        n = progress.generated_tokens
        tokens = f"{n / 1000:.1f}k" if n >= 1000 else str(n)
        bar.set_postfix_str(
            f"turn {progress.turn}/{progress.max_turns} | {tokens} tok | "
            f"{progress.tokens_per_s:.0f} tok/s",
            refresh=False,
        )
        bar.update(progress.episodes_done - bar.n)

    @contextmanager
    def closing() -> Iterator[None]:
        try:
            yield
        finally:
            for bar in bars:
                bar.close()

    return closing(), show
