"""A run's step records read back: metrics.jsonl and alerts.jsonl (see `starpo.runs`).

metrics.jsonl has one reader, `read_metrics` (one record per step: a repeated step's last
record wins), and one way into curves, `metric_curves` (null, NaN and inf are gaps);
everything that plots, budgets or summarises a run's metrics goes through them. Lines are
read by `starpo.runs.load_jsonl`'s rule, and a line without an integer 'step' is broken.

Torch-free and stdlib-only: the viewer and the report import it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from starpo.errors import UserError
from starpo.runs import JsonlRead, RunFolder, SkippedLine, load_jsonl


def _has_step(record: Mapping[str, Any]) -> bool:
    step = record.get("step")
    return isinstance(step, int) and not isinstance(step, bool)  # a flag is not a step


def load_step_records(
    path: Path, *, skip_broken: bool = False, warnings: list[str] | None = None
) -> JsonlRead:
    """`load_jsonl` of a file of step records (metrics, alerts), in file order.

    An object without an integer 'step' is a broken line like one that is not JSON: a
    UserError naming file:line, or with `skip_broken` a counted skip. The file's warning
    (skipped lines, replaced bytes), if any, is appended to `warnings`.
    """
    read = load_jsonl(path, skip_broken=skip_broken)
    stepless = [n for n, r in zip(read.numbers, read.records, strict=True) if not _has_step(r)]
    if stepless and not skip_broken:
        raise UserError(
            f"{read.path}:{stepless[0]} is not an object with an integer 'step'; fix or "
            "delete that line"
        )
    if stepless:
        kept = [(n, r) for n, r in zip(read.numbers, read.records, strict=True) if _has_step(r)]
        read.numbers, read.records = [n for n, _ in kept], [r for _, r in kept]
        read.total -= len(stepless)
        reason = "an object without an integer 'step'"
        read.skipped = sorted(
            [*read.skipped, *(SkippedLine(n, reason, torn=False) for n in stepless)],
            key=lambda line: line.number,
        )
    if warnings is not None and (message := read.warning()) is not None:
        warnings.append(message)
    return read


def read_metrics(
    run_dir: Path, *, skip_broken: bool = False, warnings: list[str] | None = None
) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`, one per step, in step order ([] when the
    file is missing). The one reader of that file; its rules:

    - lines as `load_step_records` reads them: a half-written last line is a counted skip;
      a broken line, or one without an integer 'step', is a UserError naming file:line, or
      a counted skip with `skip_broken` (readers that only display a run);
    - a step logged twice: the last record wins. A resume cuts the file back to its
      checkpoint first (`truncate_jsonl`), so a repeat means a resume that did not (an
      older starpo, a hand-joined file); the later line is the run that went on;
    - values as written: the trainer logs NaN and inf as null (`trainer.sinks`); see
      `metric_curves` for how curves read them.
    """
    read = load_step_records(RunFolder(run_dir).metrics, skip_broken=skip_broken, warnings=warnings)
    by_step = {record["step"]: record for record in read.records}  # the last one wins
    return [by_step[step] for step in sorted(by_step)]


def read_alerts(
    run_dir: Path, *, skip_broken: bool = False, warnings: list[str] | None = None
) -> list[dict[str, Any]]:
    """The collapse detector's alerts in `run_dir/alerts.jsonl`, in file order (a step can
    raise several), read by the rule of `load_step_records` ([] when the file is missing)."""
    return load_step_records(
        RunFolder(run_dir).alerts, skip_broken=skip_broken, warnings=warnings
    ).records


#: One metric's curve: (steps, values), in step order.
Curve = tuple[list[int], list[float]]


def metric_value(value: Any) -> float | None:
    """A metric value as a float, or None when it is no metric value.

    Numbers are themselves; null, NaN and +-inf are NaN (the step logged the metric, its
    value was not finite: a gap in the curve, never a point to join); booleans, strings,
    lists and objects are not metric values (a flag is not a curve).
    """
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range: not finite either
        return math.nan
    return number if math.isfinite(number) else math.nan


def metric_curves(records: Iterable[Mapping[str, Any]]) -> dict[str, Curve]:
    """Per metric key, its curve over `records` (`read_metrics`' step order), one point
    per record holding a metric value of that key (see `metric_value`)."""
    curves: dict[str, Curve] = {}
    for record in records:
        for key, value in record.items():
            number = metric_value(value)
            if key != "step" and number is not None:
                steps, values = curves.setdefault(key, ([], []))
                steps.append(record["step"])
                values.append(number)
    return curves
