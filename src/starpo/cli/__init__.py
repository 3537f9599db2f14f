"""The `starpo` command. Each subcommand is a module of this package with its parser and
its command: `add_parser(subparsers)` adds the subcommand and sets the function it runs.
The modules import torch only inside their commands, so `starpo --help` stays fast.

User mistakes (unknown env id, bad argument) print one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from starpo.cli import (
    check_env,
    demo,
    envs,
    eval,
    export,
    plan,
    play,
    report,
    serve,
    serve_env,
    sft,
    train,
    view,
)
from starpo.errors import UserError

#: The subcommands, in the order `starpo --help` lists them.
COMMANDS = (
    envs,
    check_env,
    play,
    eval,
    train,
    export,
    plan,
    sft,
    serve,
    serve_env,
    view,
    report,
    demo,
)


class _Parser(argparse.ArgumentParser):
    """A flag argparse refuses (`--episodes x`) is one line, as starpo's own errors are;
    the subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"starpo: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="starpo", description="Train and evaluate LLM agents with multi-turn RL (StarPO)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _bare_resume_flag(argv: list[str] | None) -> list[str]:
    """`--resume` not followed by `auto` becomes `--resume=latest`: argparse would take a
    KEY=VALUE override after it as the flag's optional value."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return [
        "--resume=latest" if a == "--resume" and argv[i + 1 : i + 2] != ["auto"] else a
        for i, a in enumerate(argv)
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The parsed command line. `train`'s KEY=VALUE overrides may stand anywhere, also
    after flags (argparse alone takes only the first run of them), in the order given."""
    parser = build_parser()
    args, extra = parser.parse_known_args(_bare_resume_flag(argv))
    if extra and hasattr(args, "overrides") and not any(a.startswith("-") for a in extra):
        args.overrides += extra  # later runs of positionals come back as extras, in order
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"starpo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
