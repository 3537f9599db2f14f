"""`starpo export`: a training checkpoint's policy as a Hugging Face model folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_export(args: argparse.Namespace) -> int:
    from starpo.trainer.checkpoints.export import export_checkpoint, find_checkpoint

    folder = find_checkpoint(Path(args.source), args.step)
    out = export_checkpoint(folder, Path(args.out), base=args.base)
    print(f"{folder} -> {out} (use it as --model {out} or model.name={out})")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a training checkpoint's policy as a Hugging Face model folder",
        description="Write the policy a training checkpoint saved as a plain Hugging Face "
        "model folder (LoRA merged, fp32), so an intermediate step can be evaluated, served "
        "or fine-tuned like a finished run's final/.",
    )
    p.add_argument(
        "source",
        metavar="RUN_OR_CHECKPOINT",
        help="a training run folder (its newest checkpoint, or --step) or a checkpoint "
        "folder (RUN/checkpoints/step_N)",
    )
    p.add_argument("--out", required=True, help="new model folder to write")
    p.add_argument("--step", type=int, help="with a run folder: the kept checkpoint of this step")
    p.add_argument(
        "--base",
        help="the model the run trained from, when its recorded model.name does not resolve "
        "from here (the checkpoint holds only the trainable weights)",
    )
    p.set_defaults(func=cmd_export)
