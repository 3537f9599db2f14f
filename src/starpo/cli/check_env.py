"""`starpo check-env`: the env checker on an env id (exit 0 = pass)."""

from __future__ import annotations

import argparse
from typing import Any

from starpo.cli.args import add_env_arg_flag, add_env_id_argument, parse_env_args


def cmd_check_env(args: argparse.Namespace) -> int:
    from starpo.envs import check_env, make
    from starpo.envs.checker import EnvCheckError

    env = make(args.env_id, **parse_env_args(args.env_arg))
    try:
        passed = check_env(env)
    except EnvCheckError as exc:
        print(f"FAIL {args.env_id}: {exc}")
        return 1
    finally:
        env.close()  # a remote env's session ends here
    for name in passed:
        print(f"ok    {name}")
    print(f"PASS  {args.env_id}: all {len(passed)} checks passed")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check-env", help="run the env checker on an env id (exit 0 = pass)")
    add_env_id_argument(p)
    add_env_arg_flag(p)
    p.set_defaults(func=cmd_check_env)
