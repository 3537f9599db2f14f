"""The SFT recipe as one call: records -> replayed examples -> fine-tuned model folder.

    from starpo.rollout import EpisodeSettings
    from starpo.sft import TrainOptions, run_sft
    summary = run_sft("smollm2-135m-instruct", ["runs/sokoban-solver/trajectories.jsonl"],
                      EpisodeSettings(max_turns=10), "runs/sft", from_solver=512,
                      env_id="sokoban", options=TrainOptions(epochs=2))

`out` becomes a Hugging Face model folder (`starpo.models.load_model(out)`, `starpo train
model.name=out`, `starpo eval --model out`) holding also `sft_summary.json` and the replayed
examples, `sft_data.jsonl` (Trajectory JSON, one a line).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starpo import runs
from starpo.config.episode import EpisodeSettings
from starpo.defaults import DEFAULT_MODEL, WEAK_SKILL
from starpo.errors import UserError
from starpo.logs import console_logger, warn
from starpo.sft.data import (
    SOLVER_SEED_START,
    WORLD_MODEL,
    LoadedRecords,
    policy_records,
    read_records,
    warn_validation_seeds,
)
from starpo.sft.replay import ReplayResult, replay_records
from starpo.sft.responses import check_world_model_think
from starpo.types import Episode, Record, Trajectory

if TYPE_CHECKING:
    from starpo.sft.options import TrainOptions

SUMMARY_FILE = "sft_summary.json"
DATA_FILE = runs.SFT_DATA_FILE  # the viewer shows it (`starpo view OUT`)
NOT_SUCCESSFUL = "not successful (pass --no-only-success to keep it)"


def keep_by_outcome(record: Record, only_success: bool | None, source: str = "") -> bool:
    """Whether to train on `record` (from `source`) given its outcome. `only_success`
    True: successful episodes only; False: all; None ("auto"): whatever their outcome, the
    solver's episodes (its every action is optimal, even when FrozenLake's ice made it
    fail) and the random or weak policy's that `--from-random` / `--from-weak` /
    `--from-world-model` played (a format-only, weak or world-model warm start: the turns'
    form, the policy's own lean or the transitions are the lesson, and keeping only the
    lucky successes would teach more solving); any other
    record (a model's trajectory, a random policy's episode read from a file) only when
    successful."""
    if only_success is None:
        policy = record.policy if isinstance(record, Episode) else None
        warm_start = (policy == source and policy in ("random", "weak")) or (
            policy == "random" and source == WORLD_MODEL
        )
        only_success = not (policy == "solver" or warm_start)
    return record.success or not only_success


def gather_records(
    data: Sequence[str | Path | Record],
    *,
    from_solver: int = 0,
    env_id: str | None = None,
    seed_start: int = SOLVER_SEED_START,
    env_kwargs: dict[str, Any] | None = None,
    from_random: int = 0,
    from_weak: int = 0,
    weak_skill: float = WEAK_SKILL,
    from_world_model: int = 0,
) -> LoadedRecords:
    """Records given directly, read from paths, played by the solver, by the random policy,
    by the weak one (`weak_skill`) and by the random policy again for world-model turns
    (source WORLD_MODEL), in that order, each on the seeds after the one before's."""
    given = [d for d in data if isinstance(d, (Episode, Trajectory))]
    loaded = read_records([d for d in data if not isinstance(d, (Episode, Trajectory))])
    loaded.records[:0], loaded.sources[:0] = given, ["given"] * len(given)
    first_seed = seed_start
    sources = (
        ("solver", "solver", from_solver),
        ("random", "random", from_random),
        ("weak", "weak", from_weak),
        (WORLD_MODEL, "random", from_world_model),
    )
    for source, policy, count in sources:
        if not count:
            continue
        if not env_id:
            raise UserError(f"--from-{source} needs --env (the env the {policy} policy plays)")
        played = policy_records(
            env_id,
            count,
            seed_start=first_seed,
            env_kwargs=env_kwargs,
            policy=policy,
            weak_skill=weak_skill,
        )
        loaded.records += played.records
        loaded.sources += [source] * len(played.records)
        first_seed += count  # the next policy plays other seeds
    if not loaded.records:
        raise UserError(
            "no SFT data: pass trajectories.jsonl files (from `starpo eval`), "
            "--from-solver N, --from-random N, --from-weak N or --from-world-model N (with "
            "--env ENV)"
        )
    return loaded


def data_summary(
    loaded: LoadedRecords, replay: ReplayResult, skipped: Counter[str]
) -> dict[str, Any]:
    """Counts of the data: records read, kept, skipped (by reason), tokens."""
    examples = replay.examples
    tokens = sum(len(t.token_ids) for t in examples)
    return {
        "records": len(loaded.records),
        "kept": len(examples),
        "skipped": dict(skipped.most_common()),
        "files": sorted({s.rsplit(":", 1)[0] for s in loaded.sources if ":" in s}),
        "torn_lines": loaded.torn_lines,
        "episodes": sum(isinstance(loaded.records[i], Episode) for i in replay.indices),
        "trajectories": sum(isinstance(loaded.records[i], Trajectory) for i in replay.indices),
        "turns": sum(len(t.turns) for t in examples),
        "malformed_turns": sum(not turn.format_ok for t in examples for turn in t.turns),
        "tokens": tokens,
        "agent_tokens": sum(sum(t.loss_mask) for t in examples),
        "mean_tokens_per_example": tokens / len(examples) if examples else 0.0,
        "max_tokens_per_example": max((len(t.token_ids) for t in examples), default=0),
    }


def _warn_skipped(skipped: Counter[str], total: int) -> None:
    if skipped:
        reasons = "; ".join(f"{reason}: {n}" for reason, n in skipped.most_common())
        warn(f"skipped {sum(skipped.values())} of {total} SFT records ({reasons})", "starpo.sft")


def prepare_examples(
    loaded: LoadedRecords,
    tokenizer: Any,
    settings: EpisodeSettings,
    *,
    actions_per_turn: int,
    only_success: bool | None,
    env_kwargs: dict[str, Any] | None,
    quiet: bool = True,
) -> tuple[ReplayResult, Counter[str]]:
    """Filter by outcome, replay, report what was skipped; (replay, all skip reasons)."""
    from tqdm import tqdm

    wanted = [
        i
        for i, (record, source) in enumerate(zip(loaded.records, loaded.sources, strict=True))
        if keep_by_outcome(record, only_success, source)
    ]
    skipped: Counter[str] = Counter()
    if len(wanted) < len(loaded.records):
        skipped[NOT_SUCCESSFUL] = len(loaded.records) - len(wanted)
    # World-model records think otherwise than the rest (`replay_records(world_model=...)`):
    # each kind replays in a call of its own, and the examples are merged in record order.
    replay = ReplayResult()
    with tqdm(total=len(wanted), desc="replay", unit="rec", disable=quiet) as bar:
        for world_model in (False, True):
            part = [i for i in wanted if (loaded.sources[i] == WORLD_MODEL) == world_model]
            if not part:
                continue
            done = replay_records(
                [loaded.records[i] for i in part],
                tokenizer,
                settings,
                actions_per_turn=actions_per_turn,
                env_kwargs=env_kwargs,
                on_progress=bar.update,
                world_model=world_model,
            )
            replay.indices += [part[i] for i in done.indices]
            replay.examples += done.examples
            replay.skipped.update(done.skipped)
    order = sorted(range(len(replay.indices)), key=replay.indices.__getitem__)
    replay.indices = [replay.indices[k] for k in order]
    replay.examples = [replay.examples[k] for k in order]
    skipped.update(replay.skipped)
    _warn_skipped(skipped, len(loaded.records))
    if not replay.examples:
        raise UserError(
            f"none of the {len(loaded.records)} records can be used for SFT "
            f"({'; '.join(f'{r}: {n}' for r, n in skipped.most_common())})"
        )
    return replay, skipped


def run_sft(
    model: str | Path | tuple[Any, Any] = DEFAULT_MODEL,
    data: Sequence[str | Path | Record] = (),
    settings: EpisodeSettings | None = None,
    out: str | Path = "runs/sft",
    *,
    options: TrainOptions | None = None,
    actions_per_turn: int = 1,
    only_success: bool | None = None,
    from_solver: int = 0,
    env_id: str | None = None,
    seed_start: int = SOLVER_SEED_START,
    env_kwargs: dict[str, Any] | None = None,
    from_random: int = 0,
    from_weak: int = 0,
    weak_skill: float = WEAK_SKILL,
    from_world_model: int = 0,
    device: str = "cpu",
    quiet: bool = False,
) -> dict[str, Any]:
    """Fine-tune `model` (a name, folder or hub id, or an in-process (model, tokenizer),
    trained in place) on
    `data` (trajectories.jsonl paths or eval folders, and/or records) plus `from_solver`
    solver episodes, `from_random` random-policy episodes and `from_weak` weak-policy
    episodes (`weak_skill` of its moves the solver's) and `from_world_model` random-policy
    episodes whose turns think as a world model (needs `settings.think`) of `env_id`, laid
    out as RL
    rollouts under `settings` (the RL run's `EpisodeSettings`; default: its defaults).
    Writes `out` (module docstring) and returns the summary written to
    `out/sft_summary.json`."""
    from starpo.models import load_model, load_tokenizer
    from starpo.sft.options import TrainOptions
    from starpo.sft.train import split_validation, train_epochs

    started = time.perf_counter()
    settings = settings or EpisodeSettings()
    if from_world_model:
        check_world_model_think(settings.think)  # before any episode is played
    options = options or TrainOptions()
    log = console_logger("starpo.sft")
    say = (lambda _line: None) if quiet else log.info
    loaded = gather_records(
        data,
        from_solver=from_solver,
        env_id=env_id,
        seed_start=seed_start,
        env_kwargs=env_kwargs,
        from_random=from_random,
        from_weak=from_weak,
        weak_skill=weak_skill,
        from_world_model=from_world_model,
    )
    validation_records = warn_validation_seeds(loaded.records)
    in_process = isinstance(model, tuple)
    tokenizer = model[1] if in_process else load_tokenizer(model)
    replay, skipped = prepare_examples(
        loaded,
        tokenizer,
        settings,
        actions_per_turn=actions_per_turn,
        only_success=only_success,
        env_kwargs=env_kwargs,
        quiet=quiet,
    )
    replay_seconds = time.perf_counter() - started
    lm = model[0] if in_process else load_model(model, device=device, dtype="float32")[0]
    examples = replay.examples
    train_idx, val_idx = split_validation(examples, options.val_fraction, options.seed)
    say(
        f"SFT on {len(train_idx)} trajectories ({len(val_idx)} held out), "
        f"{sum(sum(examples[i].loss_mask) for i in train_idx)} agent tokens"
    )
    train_started = time.perf_counter()
    history = train_epochs(
        lm,
        [examples[i] for i in train_idx],
        [examples[i] for i in val_idx],
        options,
        tokenizer.pad_token_id,
        progress=None if quiet else _progress_bar(options.epochs),
        say=say,
    )
    train_seconds = time.perf_counter() - train_started
    summary = {
        "model": str(model if not in_process else type(lm).__name__),
        "out": str(out),
        "data": {
            **data_summary(loaded, replay, skipped),
            "from_solver": from_solver,
            "from_random": from_random,
            "from_weak": from_weak,
            **({"weak_skill": weak_skill} if from_weak else {}),
            **({"from_world_model": from_world_model} if from_world_model else {}),
            "validation_seed_records": validation_records,
            "train_examples": len(train_idx),
            "val_examples": len(val_idx),
            "val_seeds": sorted({examples[i].seed for i in val_idx}),
        },
        "settings": settings.model_dump(),
        "actions_per_turn": actions_per_turn,
        "only_success": "auto" if only_success is None else only_success,
        "env_kwargs": dict(env_kwargs or {}),
        "options": options.model_dump(),
        "device": device,
        "epochs": history,
        "seconds": {"replay": replay_seconds, "training": train_seconds},
    }
    write_outputs(Path(out), lm, tokenizer, examples, summary, started)
    return summary


def write_outputs(
    out: Path,
    model: Any,
    tokenizer: Any,
    examples: list[Trajectory],
    summary: dict[str, Any],
    started: float,
) -> None:
    """The model folder (`compute.weights.export_policy`, the trainer's too: weights and a
    portable tokenizer), the replayed examples, and the summary with the total time since
    `started`."""
    from starpo.compute.weights import export_policy

    out.mkdir(parents=True, exist_ok=True)
    export_policy(model, tokenizer, out, uses_lora=False)
    with open(out / DATA_FILE, "w", encoding="utf-8") as f:
        f.writelines(t.to_json() + "\n" for t in examples)
    summary["seconds"]["total"] = time.perf_counter() - started
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _progress_bar(epochs: int) -> Any:
    """`progress(epoch, steps)` for `train_epochs`: one tqdm bar an epoch."""
    from tqdm import tqdm

    return lambda epoch, steps: tqdm(total=steps, desc=f"sft epoch {epoch}/{epochs}", unit="step")
