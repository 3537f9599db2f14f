"""A pass-rate-controlled run (`curriculum.enabled`) in blocks of steps: where episodes
started, how often they passed, and how the full task went on validation.

    python experiments/curriculum_curve.py runs/fl-curriculum-s1/rl-grpo
    python experiments/curriculum_curve.py runs/fl-curriculum-s1/rl-grpo --block 10

Per block of `--block` training steps: the controller's k (moves before the end, as
played), the mean moves left at the part-way groups' starts, the share of groups that
played the full task, the training pass rate (the controller's input) and the share of
informative groups (rewards that vary); then the validation success (the full task) of
the validation steps inside the block, with the run's validation seeds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from starpo.errors import UserError
from starpo.runs.metrics import read_metrics
from starpo.stats import mean

COLUMNS = {
    "k": "curriculum/moves",
    "start moves": "curriculum/mean_start_moves",
    "full task": "curriculum/full_task_groups",
    "pass rate": "signal/pass_rate",
    "informative": "signal/informative_groups",
}


def block_rows(records: list[dict], block: int) -> list[dict]:
    """One row per block of `block` training steps (step 0, validation only, stands alone):
    the mean of each column over the block's steps, and the validation successes logged in
    it, by step."""
    if block < 1:
        raise UserError(f"--block must be at least 1, got {block}")
    rows: dict[int, dict] = {}
    for record in records:
        step = record["step"]
        first = 0 if step == 0 else (step - 1) // block * block + 1
        row = rows.setdefault(first, {"steps": [first, first], "values": {}, "val": {}})
        row["steps"][1] = step
        for label, key in COLUMNS.items():
            if key in record:
                row["values"].setdefault(label, []).append(record[key])
        for key, value in record.items():
            if key.startswith("val/") and key.endswith("/success"):
                row["val"][step] = value
    return [
        {
            "steps": tuple(row["steps"]),
            **{label: mean(values) for label, values in row["values"].items()},
            "val": row["val"],
        }
        for _, row in sorted(rows.items())
    ]


def format_rows(rows: list[dict]) -> str:
    head = ["steps", *COLUMNS, "validation (step: success)"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in rows:
        first, last = row["steps"]
        cells = [f"{first}-{last}" if last != first else str(first)]
        cells += [f"{row[label]:.2f}" if label in row else "" for label in COLUMNS]
        cells.append(", ".join(f"{step}: {value:.2f}" for step, value in row["val"].items()))
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="the RL run's folder (with metrics.jsonl)")
    parser.add_argument("--block", type=int, default=5, help="training steps a row (default 5)")
    args = parser.parse_args(argv)
    try:
        records = read_metrics(Path(args.run))
        if not records:
            raise UserError(f"{args.run} holds no metrics.jsonl records: pass an RL run folder")
        if not any(COLUMNS["k"] in r for r in records):
            raise UserError(f"{args.run} logged no curriculum/moves: not a curriculum run")
        print(format_rows(block_rows(records, args.block)))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
