"""How often does a model read the state back and predict the next one exactly? The
world-model measure of `starpo sft --from-world-model` (SPA-style turns: `<observation>`
and `<prediction>` in the think block), read from saved episodes, before and after RL.

    python experiments/world_model_accuracy.py runs/recipe-fl/sft-eval       # starpo eval --out
    python experiments/world_model_accuracy.py runs/recipe-fl/rl-grpo        # each validation step
    python experiments/world_model_accuracy.py runs/a/trajectories.jsonl runs/b

Each PATH is a `trajectories.jsonl` (or an `sft_data.jsonl`), a folder holding one (`starpo
eval --out`, a recipe's `*-eval/`, an RFT round's `samples/`, an SFT output), or a `starpo
train` run, whose saved validation episodes (`val_trajectories/step_N.jsonl`) give one row
a step. Every turn counts: its `<prediction>` is right when it equals, up to whitespace
within a line, the state the env showed after the turn (the next turn's, or the episode's
final state); its `<observation>` when it equals the state the turn was shown
(`starpo.evaluation.world_model`). "written" is the share of turns with a well-formed
field at all: a model that stopped writing them scores 0 exact, not a gap.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from starpo.evaluation.world_model import score_trajectories
from starpo.runs import (
    EVAL_TRAJECTORIES_FILE,
    SFT_DATA_FILE,
    VAL_TRAJECTORIES_DIR,
    load_jsonl,
    step_files,
    warn_skipped,
)
from starpo.types import Trajectory, record_from_dict


def episode_files(path: Path) -> list[tuple[str, Path]]:
    """(row label, file) of every set of episodes `path` names (see the module docstring);
    [] when it names none."""
    if path.is_file():
        return [(str(path), path)]
    for name in (EVAL_TRAJECTORIES_FILE, SFT_DATA_FILE):
        if (path / name).is_file():
            return [(str(path), path / name)]
    return [(f"{path} step {step}", file) for step, file in step_files(path / VAL_TRAJECTORIES_DIR)]


def read_trajectories(path: Path) -> list[Trajectory]:
    """The model trajectories of one JSONL file (a scripted policy's episodes have no reply
    to score and are left out)."""
    read = load_jsonl(path, skip_broken=True)
    warn_skipped(read)
    records = (record_from_dict(record) for record in read.records)
    return [record for record in records if isinstance(record, Trajectory)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    args = parser.parse_args(argv)
    rows = [row for path in args.paths for row in episode_files(path)]
    missing = [path for path in args.paths if not episode_files(path)]
    if missing:
        print(f"error: no episodes in {missing[0]}; pass a trajectories.jsonl, a `starpo "
              f"eval --out` folder or a `starpo train` run", file=sys.stderr)  # fmt: skip
        return 2
    width = max(len(label) for label, _ in rows)
    print(f"{'episodes':<{width}}  {'turns':>6}  {'prediction':>10}  {'observation':>11}  "
          f"{'pred. written':>13}  {'obs. written':>12}")  # fmt: skip
    for label, file in rows:
        rates = score_trajectories(read_trajectories(file)).rates()
        print(f"{label:<{width}}  {rates['turns']:>6}  {rates['prediction_exact']:>10.1%}  "
              f"{rates['observation_exact']:>11.1%}  {rates['prediction_written']:>13.1%}  "
              f"{rates['observation_written']:>12.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
