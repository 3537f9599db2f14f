"""`starpo plan`: a training config's peak memory, estimated part by part before any model
loads, against this machine's memory."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_plan(args: argparse.Namespace) -> int:
    from starpo.config import load_config
    from starpo.memory.fit import format_plan, machine_memory
    from starpo.memory.plan import plan_config

    cfg = load_config(args.config, args.overrides)
    print(format_plan(plan_config(cfg), machine_memory()))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="estimate a training config's peak memory before loading any model",
        description="Estimate the peak memory of `starpo train` with this config, part by "
        "part (weights, optimizer, activations, KV cache), against this machine's memory. "
        "Reads only the model's config.json and tokenizer.",
    )
    p.add_argument("--config", help="YAML file or preset, as for starpo train")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides (anywhere)"
    )
    p.set_defaults(func=cmd_plan)
