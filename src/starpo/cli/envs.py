"""`starpo envs`: the registered environment ids, one line each."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_envs(args: argparse.Namespace) -> int:
    from starpo.envs import registered_ids, spec

    ids = registered_ids()
    width = max(len(i) for i in ids)
    for env_id in ids:
        print(f"{env_id:<{width}}  {spec(env_id).summary()}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("envs", help="list the registered environment ids")
    p.set_defaults(func=cmd_envs)
