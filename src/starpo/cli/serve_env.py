"""`starpo serve-env`: a registered env as an OpenEnv environment server (wired into
`starpo.cli`). The parser imports neither openenv-core nor FastAPI; the command does."""

from __future__ import annotations

import argparse
from typing import Any

from starpo.cli.args import add_env_arg_flag, add_env_id_argument
from starpo.cli.serve import add_address_flags, positive_int, serve_until_stopped
from starpo.errors import UserError

DESCRIPTION = """\
Serve a starpo env (any registered id) as an OpenEnv environment server, so OpenEnv clients
and the trainers that use them (TRL, SkyRL, ...) can play it: sessions on /ws (one game
each), openenv-core's /reset, /step, /state, /schema, /metadata and /health, and GET
/sessions. Listens on 127.0.0.1 by default. Needs the openenv extra."""

MISSING_EXTRA = "starpo serve-env needs the openenv extra: pip install 'starpo[openenv]'"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `serve-env` command to `starpo`'s subparsers; returns its parser."""
    p = subparsers.add_parser(
        "serve-env",
        help="serve an env as an OpenEnv environment server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_env_id_argument(p)
    add_env_arg_flag(p)
    add_address_flags(p, port=8001)
    p.add_argument(
        "--max-sessions",
        type=positive_int,
        default=256,
        help="most sessions (games) at once; one more is refused (default 256). starpo "
        "plays every episode of a rollout at once: allow a step's episodes "
        "(rollout.num_groups x rollout.group_size) and trainer.val_batch_size",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="end a session idle this long (default 600; 0 = never)",
    )
    p.set_defaults(func=cmd_serve_env)
    return p


def cmd_serve_env(args: argparse.Namespace) -> int:
    from starpo.cli.args import parse_env_args

    if not args.idle_timeout >= 0:  # also refuses nan
        raise UserError(f"--idle-timeout must be 0 or more seconds, got {args.idle_timeout}")
    env_kwargs = parse_env_args(args.env_arg)
    try:
        import uvicorn  # noqa: F401

        from starpo.serve.env_server import build_env_app
    except ImportError:
        raise UserError(MISSING_EXTRA) from None
    app = build_env_app(
        args.env_id,
        env_kwargs,
        max_sessions=args.max_sessions,
        idle_timeout_s=args.idle_timeout or None,
    )
    return serve_until_stopped(app, args, what=f"env {args.env_id} (OpenEnv)")
