"""SFT input: records read from `trajectories.jsonl` files, or played by the solver.

A record is what `starpo eval` and `starpo train` write, one a line (`starpo.types`): an
`Episode` of a scripted policy (single-action steps) or a `Trajectory` of a model (turns with
their response text and tokens). Reading follows the package's JSONL rule
(`starpo.runs.load_jsonl`): a torn last line is a counted skip, anything else that is not a
record is a one-line `UserError` naming file and line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starpo import runs
from starpo.defaults import VALIDATION_SEED_START, VALIDATION_SEEDS, WEAK_SKILL
from starpo.errors import UserError
from starpo.evaluation.scripted import play_episodes
from starpo.logs import warn
from starpo.types import Record, record_from_dict

#: First seed of `--from-solver` data: far above the fixed validation seeds
#: (VALIDATION_SEED_START, VALIDATION_SEEDS of them: the trainer's defaults) and above
#: the RL run's own training seeds (`rollout.train_seed_start` = 10000, 8 a step), so SFT
#: never trains on a state that validation or the first RL steps play.
SOLVER_SEED_START = 100_000
#: The source of `--from-world-model` records: the random policy's episodes, whose turns
#: think as a world model (the state read back, the next one predicted) when replayed.
WORLD_MODEL = "world-model"


@dataclass
class LoadedRecords:
    """Records in file order, with where each came from and what was left out."""

    records: list[Record]
    sources: list[str]  # "file:line" (or "solver") of each record
    torn_lines: int = 0  # half-written last lines skipped (a crashed writer)


def validation_seeds() -> range:
    return range(VALIDATION_SEED_START, VALIDATION_SEED_START + VALIDATION_SEEDS)


def parse_record(record: dict[str, Any], where: str) -> Record:
    """One JSON object as an `Episode` or a `Trajectory`; a UserError naming `where`."""
    try:
        return record_from_dict(record)
    except (TypeError, ValueError, KeyError) as exc:
        raise UserError(
            f"{where} is not a trajectory or episode record ({_first_line(exc)}); pass "
            f"trajectories.jsonl files written by `starpo eval` or `starpo train`, or delete "
            f"that line"
        ) from None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def resolve_data_path(path: str | Path) -> Path:
    """`path` itself, or the `trajectories.jsonl` inside an eval folder."""
    path = Path(path)
    if path.is_dir():
        inside = path / runs.EVAL_TRAJECTORIES_FILE
        if inside.is_file():
            return inside
        raise UserError(
            f"{path} is a folder without {runs.EVAL_TRAJECTORIES_FILE}; pass a "
            f"trajectories.jsonl file or a `starpo eval --out` folder"
        )
    if not path.is_file():
        raise UserError(
            f"{path}: no such file; pass trajectories.jsonl files written by `starpo eval` "
            f"(or use --from-solver N to play the solver instead)"
        )
    return path


def read_records(paths: Sequence[str | Path]) -> LoadedRecords:
    """Every record of every file, in order (see the module docstring for bad lines)."""
    loaded = LoadedRecords([], [])
    for given in paths:
        path = resolve_data_path(given)
        read = runs.load_jsonl(path)  # raises for a broken line inside the file
        runs.warn_skipped(read)
        loaded.torn_lines += len(read.skipped)
        for number, record in zip(read.numbers, read.records, strict=True):
            where = f"{path}:{number}"
            loaded.records.append(parse_record(record, where))
            loaded.sources.append(where)
    return loaded


def policy_records(
    env_id: str,
    num_episodes: int,
    *,
    seed_start: int = SOLVER_SEED_START,
    env_kwargs: dict[str, Any] | None = None,
    policy: str = "solver",
    weak_skill: float = WEAK_SKILL,
) -> LoadedRecords:
    """`num_episodes` episodes of the solver (or of another reference `policy`: `random`
    for a format-only warm start, `weak` with `weak_skill` for a weak one) on seeds
    `seed_start`, `seed_start + 1`, ..., which must not touch the fixed validation seeds.
    Each record's source is the policy's name."""
    if num_episodes < 1:
        raise UserError(f"--from-{policy} must be at least 1, got {num_episodes}")
    seeds = range(seed_start, seed_start + num_episodes)
    val = validation_seeds()
    if seeds.start < val.stop and val.start < seeds.stop:
        raise UserError(
            f"solver seeds {seeds.start}..{seeds.stop - 1} overlap the validation seeds "
            f"{val.start}..{val.stop - 1}; use --seed-start {SOLVER_SEED_START} (the default)"
        )
    episodes = list(
        play_episodes(
            env_id,
            policy,
            num_episodes,
            seed_start=seed_start,
            env_kwargs=env_kwargs,
            weak_skill=weak_skill,
        )
    )
    return LoadedRecords(list(episodes), [policy] * len(episodes))


def warn_validation_seeds(records: Sequence[Record]) -> int:
    """Warn (one line) when records were played on validation seeds, whose success would
    then be measured on trained-on states; return how many."""
    val = validation_seeds()
    count = sum(r.seed in val for r in records)
    if count:
        warn(
            f"{count} of {len(records)} SFT records use validation seeds "
            f"({val.start}..{val.stop - 1}); validation success after SFT will be optimistic "
            f"(make SFT data on other seeds, e.g. starpo eval --seed-start {SOLVER_SEED_START})",
            "starpo.sft",
        )
    return count
