"""RAGEN-2's template-collapse probe: every `diagnostics.mi_every` steps, cross-score a
sample of the step's (prompt, reply) pairs under the actor and log the mutual-information
metrics of `diagnostics.template_collapse` under `diagnostics/mi/<sample>/...`, with its
cost as `timing_s/mi_probe`.

Two samples, as RAGEN-2: `first_turn` (each sampled trajectory's first prompt and reply)
and `uniform` (trajectories drawn uniformly, then one turn uniformly within each; the
prompt is the whole context that turn saw). Sampling uses its own `random.Random`, seeded
from the step's seed, so a resumed run samples the same pairs, and no other random stream
of training moves; the scoring runs without gradients in eval mode (no dropout), so the
probe changes nothing the run computes besides its own metrics.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from contextlib import contextmanager

from starpo.compute.cross_scoring import cross_scores
from starpo.config.diagnostics import DiagnosticsConfig
from starpo.diagnostics.template_collapse import mi_key, template_collapse_metrics
from starpo.timing import Timer
from starpo.trainer.train_models import TrainModels
from starpo.trainer.update_settings import UpdateSettings
from starpo.types import Trajectory

#: One sampled turn: (prompt token ids, reply token ids).
Pair = tuple[list[int], list[int]]


def reply_spans(traj: Trajectory) -> list[tuple[int, int]]:
    """[start, end) of each turn's reply in `traj.token_ids`: the generated tokens up to
    the turn's last one (`turn_ends`); the prompt of the turn is everything before start,
    back to the last context reset (`Trajectory.context_resets`). A turn that generated
    nothing has start == end."""
    spans = []
    for end in traj.turn_ends:
        start = end + 1
        while start > 0 and traj.loss_mask[start - 1]:
            start -= 1
        spans.append((start, end + 1))
    return spans


def turn_pair(traj: Trajectory, span: tuple[int, int]) -> Pair:
    """The (prompt, reply) token ids of the turn at `span` (see `reply_spans`)."""
    start, end = span
    opening = max((r for r in traj.context_resets if r <= start), default=0)
    return list(traj.token_ids[opening:start]), list(traj.token_ids[start:end])


def _scorable(traj: Trajectory) -> list[tuple[int, int]]:
    """The spans of `traj`'s turns with at least one reply token (nothing to score else)."""
    return [span for span in reply_spans(traj) if span[1] > span[0]]


def first_turn_sample(trajectories: Sequence[Trajectory], n: int, rng: random.Random) -> list[Pair]:
    """Up to `n` trajectories drawn uniformly without replacement among those whose first
    turn has a reply; each one's first (prompt, reply)."""
    spans = [reply_spans(t) for t in trajectories]
    eligible = [i for i, s in enumerate(spans) if s and s[0][1] > s[0][0]]
    picked = rng.sample(eligible, min(n, len(eligible)))
    return [turn_pair(trajectories[i], spans[i][0]) for i in picked]


def uniform_sample(trajectories: Sequence[Trajectory], n: int, rng: random.Random) -> list[Pair]:
    """Up to `n` trajectories drawn uniformly without replacement among those with a
    reply, then one of each one's turns uniformly: trajectory-uniform, so a long episode
    weighs no more than a short one."""
    spans = [_scorable(t) for t in trajectories]
    eligible = [i for i, s in enumerate(spans) if s]
    picked = rng.sample(eligible, min(n, len(eligible)))
    return [turn_pair(trajectories[i], rng.choice(spans[i])) for i in picked]


SAMPLERS = {"first_turn": first_turn_sample, "uniform": uniform_sample}


@contextmanager
def _eval_mode(model):
    """`model` in eval mode (no dropout) for the block, then as it was."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def sample_metrics(
    pairs: list[Pair], sample: str, models: TrainModels, settings: UpdateSettings
) -> dict:
    """The template-collapse metrics of one sample of pairs ({} below two pairs: one
    reply has nothing to be told apart from), scored as the update scores log-probs."""
    if len(pairs) < 2:
        return {}
    prompts, replies = [p for p, _ in pairs], [r for _, r in pairs]
    with _eval_mode(models.actor), models.precision.autocast():
        scores = cross_scores(
            models.actor,
            prompts,
            replies,
            settings.temperature,
            models.tokenizer.pad_token_id,
            max_rows=settings.optim.micro_batch_size,
        )
    return template_collapse_metrics(scores.numpy(), prefix=mi_key(sample, ""))


def mi_probe(
    step: int,
    trajectories: Sequence[Trajectory],
    models: TrainModels,
    diagnostics: DiagnosticsConfig,
    settings: UpdateSettings,
    seed: int,
) -> dict[str, float]:
    """The probe's metrics at `step` ({} unless diagnostics.mi_every > 0 divides it), from
    a sample of diagnostics.mi_samples pairs each, drawn with `seed`, and its seconds."""
    every = diagnostics.mi_every
    if every <= 0 or step % every:
        return {}
    timer, metrics = Timer(), {}
    rng = random.Random(seed)
    with timer("mi_probe"):
        for sample, draw in SAMPLERS.items():
            pairs = draw(trajectories, diagnostics.mi_samples, rng)
            metrics.update(sample_metrics(pairs, sample, models, settings))
    return {**metrics, **timer.metrics()}
