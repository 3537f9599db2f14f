"""`starpo report`: PNG plots of training runs (several runs: compared)."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_report(args: argparse.Namespace) -> int:
    from starpo.viewer.report import report_main

    return report_main(args.runs, args.out, args.x)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="PNG plots of training runs (several runs: compared)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="training run folders")
    p.add_argument("--out", default=None, help="output folder (default RUN/report/)")
    p.add_argument(
        "--x",
        default="steps",
        choices=("steps", "minutes"),
        help="x axis: steps (default), or cumulative training minutes (validation "
        "excluded), to compare runs at the same wall-clock budget",
    )
    p.set_defaults(func=cmd_report)
