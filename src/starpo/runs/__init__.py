"""The run folder: its file names, and the one way its JSONL files are written and read.

A training run folder (`starpo train --out RUN`):

    RUN/config.yaml                   the config the run was started with
    RUN/metrics.jsonl                 one `{"step": N, <metric>: value, ...}` object a line
    RUN/alerts.jsonl                  the collapse detector's alerts, one a line
    RUN/trajectories/step_NNNNNN.jsonl      sampled training trajectories of step N
    RUN/val_trajectories/step_NNNNNN.jsonl  every validation trajectory of step N
    RUN/checkpoints/step_NNNNNN/      resumable checkpoints (see trainer/checkpoints/store.py)
    RUN/healthy/checkpoints/...       the last checkpoint taken while the detector was healthy
    RUN/final/                        the trained policy as a Hugging Face folder
    RUN/tensorboard/, RUN/wandb_id.txt      optional mirrors of metrics.jsonl

An eval folder (`starpo eval --out DIR`) holds `trajectories.jsonl` and `summary.json`.
Readers (viewer, report) write only `viewer.html` and `report/` beside them.

Reading JSONL follows one rule, here and nowhere else. `read_jsonl` never raises for the
content of a file: bytes that are not UTF-8 are replaced by U+FFFD (the line is kept and
counted in `JsonlRead.replaced`), and a line that is not valid JSON or not a JSON object is
skipped and listed in `JsonlRead.skipped`, so the caller can report a count instead of a
traceback. `load_jsonl` is what the package's readers call: a torn last line (the writer
was killed mid-line, the expected damage of a crash) stays a counted skip. A broken line
inside the file is a `UserError` naming file and line for the readers that train or resume
from it (only corruption or a second writer produce one); the viewer and the report, which
only display a run, skip it with a warning and a count (`skip_broken`).

metrics.jsonl and alerts.jsonl are read back by `starpo.runs.metrics`, on top of this rule.

Torch-free and stdlib-only: the viewer and the report import it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from starpo.errors import UserError
from starpo.logs import warn

# ---- names -------------------------------------------------------------------------------

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
ALERTS_FILE = "alerts.jsonl"
TRAJECTORIES_DIR = "trajectories"
VAL_TRAJECTORIES_DIR = "val_trajectories"
CHECKPOINTS_DIR = "checkpoints"
HEALTHY_DIR = "healthy"
FINAL_DIR = "final"
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_id.txt"
EVAL_TRAJECTORIES_FILE = "trajectories.jsonl"
SFT_DATA_FILE = "sft_data.jsonl"  # `starpo sft --out DIR`: the replayed examples
SUMMARY_FILE = "summary.json"
EVAL_RUN_FILE = "eval_run.json"  # `starpo eval --policy api`: what its episodes were played with
VIEWER_FILE = "viewer.html"
REPORT_DIR = "report"

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl")
_STEP_DIR = re.compile(r"step_(\d+)")


def step_name(step: int) -> str:
    """`step_000010`: the stem of a step's trajectory file and a checkpoint's folder name.

    Zero-padded so that names sort like steps in a file browser.
    """
    return f"step_{step:06d}"


def step_file(folder: Path, step: int) -> Path:
    """`folder/step_NNNNNN.jsonl`: the trajectory file of `step`."""
    return Path(folder) / f"{step_name(step)}.jsonl"


def step_files(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of every `step_N.jsonl` in `folder`, sorted by step ([] if no folder)."""
    return _by_step(folder, _STEP_FILE)


def step_dirs(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of every `step_N` folder in `folder`, sorted by step ([] if no folder).

    Temp folders of a save in progress (`.tmp-step_N-PID`) do not match.
    """
    return [(step, path) for step, path in _by_step(folder, _STEP_DIR) if path.is_dir()]


def _by_step(folder: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = pattern.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def check_writable(folder: Path, what: str = "run folder") -> None:
    """A one-line UserError when `folder` cannot be created or written (checked before any
    model loads or episode plays, so a mistyped or read-only --out costs nothing)."""
    folder = Path(folder)
    probe = folder / f".starpo-write-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(
            f"cannot write the {what} {folder} ({exc.strerror or exc}); choose another "
            "--out or fix its permissions"
        ) from exc


@dataclass(frozen=True)
class RunFolder:
    """The paths of one training run folder (nothing is created by asking)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def alerts(self) -> Path:
        return self.root / ALERTS_FILE

    @property
    def trajectories(self) -> Path:
        return self.root / TRAJECTORIES_DIR

    @property
    def val_trajectories(self) -> Path:
        return self.root / VAL_TRAJECTORIES_DIR

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def healthy(self) -> Path:
        """A run folder of its own: `healthy/checkpoints/step_N/`."""
        return self.root / HEALTHY_DIR

    @property
    def final(self) -> Path:
        return self.root / FINAL_DIR

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def wandb_id(self) -> Path:
        return self.root / WANDB_ID_FILE

    def outputs(self) -> list[Path]:
        """What a training run writes here, besides its config: what a fresh start in this
        folder must remove so that nothing of an older run mixes with the new one."""
        return [
            self.metrics,
            self.alerts,
            self.trajectories,
            self.val_trajectories,
            self.checkpoints,
            self.healthy,
            self.final,
            self.tensorboard,
            self.wandb_id,
            self.root / REPORT_DIR,
            self.root / VIEWER_FILE,
        ]

    def holds_run(self) -> list[str]:
        """Names of the outputs of an earlier run found here ([] for a new folder)."""
        return [path.name for path in self.outputs() if path.exists()]

    def clear(self) -> None:
        """Remove an earlier run's outputs (see `outputs`)."""
        for path in self.outputs():
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()


# ---- writing -----------------------------------------------------------------------------


def json_line(record: Mapping[str, Any], *, allow_nan: bool = True) -> str:
    """`record` as one JSONL line, newline included.

    ensure_ascii=False keeps model text readable in the file; JSON escapes every control
    character, so the only raw newline is the terminator.
    """
    return json.dumps(record, ensure_ascii=False, allow_nan=allow_nan) + "\n"


def open_for_append(path: Path) -> IO[str]:
    """`path` opened to append lines; line-buffered, so each record reaches the OS at once."""
    return open(path, "a", encoding="utf-8", buffering=1)


def append_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Append `records` to `path`, one line each (the folder is created when missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.writelines(json_line(r) for r in records)


def write_lines_atomic(path: Path, lines: Iterable[str]) -> Path:
    """Replace `path` by `lines` through a temp file and a rename.

    Readers and a crash see the old file or the new one, never half of one.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    os.replace(tmp, path)
    return path


def rewrite_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Replace `path` atomically by `records`, one line each."""
    return write_lines_atomic(path, (json_line(r) for r in records))


# ---- reading -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SkippedLine:
    """A line `read_jsonl` could not use."""

    number: int  # 1-based
    reason: str
    torn: bool  # the last line, without its newline: a write cut short


@dataclass
class JsonlRead:
    """What `read_jsonl` found in one file."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)  # line number of each record
    skipped: list[SkippedLine] = field(default_factory=list)
    total: int = 0  # records, plus the non-blank lines past `limit` (never parsed)
    replaced: list[int] = field(default_factory=list)  # records whose bad bytes became U+FFFD

    def warning(self) -> str | None:
        """One line for the user about the file's skipped lines and replaced bytes, or None
        when there were neither."""
        parts = []
        if self.skipped:
            first = self.skipped[0]
            if len(self.skipped) == 1 and first.torn:
                parts.append(
                    f"skipped a half-written last line (line {first.number}, {first.reason})"
                )
            else:
                parts.append(
                    f"skipped {len(self.skipped)} unreadable line(s) "
                    f"(first: line {first.number}, {first.reason})"
                )
        if self.replaced:
            parts.append(
                f"replaced bytes that are not UTF-8 with U+FFFD in {len(self.replaced)} "
                f"line(s) (first: line {self.replaced[0]})"
            )
        return f"{self.path}: {'; '.join(parts)}" if parts else None


def _decode(raw: bytes) -> tuple[str, bool]:
    """The line's text, and whether bytes that are not UTF-8 were replaced (by U+FFFD): a
    stray byte in model text must not cost the reader the whole episode."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True


def _parse(text: str) -> dict[str, Any] | str:
    """One line's JSON object, or the reason it is not one."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg})"
    return record if isinstance(record, dict) else "not a JSON object"


def read_jsonl(path: Path, *, limit: int | None = None) -> JsonlRead:
    """The JSON objects of `path`, one a line; unreadable lines are skipped and listed.

    Never raises for the file's content; a missing file reads as empty. After `limit`
    records the remaining lines are counted in `total` but not parsed (a page showing the
    first 200 episodes need not decode 10,000).
    """
    result = JsonlRead(Path(path))
    if not result.path.is_file():
        return result
    # Binary lines: split on b"\n" only (never on U+2028 or a lone \r inside model text),
    # and decode each line alone so one bad byte costs one line, not the file.
    with result.path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            if limit is not None and len(result.records) >= limit:
                result.total += 1
                continue
            text, replaced = _decode(raw)
            parsed = _parse(text)
            if isinstance(parsed, str):
                torn = not raw.endswith(b"\n")  # only the last line can lack it
                result.skipped.append(SkippedLine(number, parsed, torn))
            else:
                result.total += 1
                result.records.append(parsed)
                result.numbers.append(number)
                if replaced:
                    result.replaced.append(number)
    return result


def load_jsonl(path: Path, *, limit: int | None = None, skip_broken: bool = False) -> JsonlRead:
    """`read_jsonl`, then the package's rule: a torn last line stays a counted skip (see
    `JsonlRead.warning`); a broken line inside the file is a UserError naming file:line,
    unless `skip_broken` (readers that only display a run: a counted skip as well).
    Bytes that are not UTF-8 never stop a reader: they are replaced and counted.
    """
    result = read_jsonl(path, limit=limit)
    for line in [] if skip_broken else result.skipped:
        if not line.torn:
            raise UserError(
                f"{result.path}:{line.number} is {line.reason}; fix or delete that line"
            )
    return result


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep only the records of steps <= `step` (resuming from a checkpoint taken at
    `step`), rewritten atomically; a half-written last line, left by the crash being
    resumed from, is dropped with a warning. A missing file stays missing."""
    if not Path(path).is_file():
        return
    read = load_jsonl(path)
    warn_skipped(read)
    rewrite_jsonl(path, (r for r in read.records if r["step"] <= step))


def warn_skipped(result: JsonlRead) -> None:
    """Print `result`'s warning (if any) on stderr, as one `warning: ...` line."""
    message = result.warning()
    if message is not None:
        warn(message, "starpo.runs")
