"""`starpo view`: a static HTML viewer of a run or eval folder, optionally served."""

from __future__ import annotations

import argparse
from typing import Any


def cmd_view(args: argparse.Namespace) -> int:
    from starpo.viewer import view_main

    return view_main(args.run, serve=args.serve, port=args.port)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("view", help="write a static HTML viewer of a run or eval folder")
    p.add_argument("run", metavar="RUN", help="a training run folder or a starpo eval --out folder")
    p.add_argument("--serve", action="store_true", help="also serve it on 127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="port for --serve (default: any free)")
    p.set_defaults(func=cmd_view)
