"""Success per case family of `starpo eval` folders: which kinds of case a trained agent
solves. Each episode's case is made again from its seed (the envs are seeded) and grouped
by a key of the env's reset info: invoice's `problem`, support's `request`.

    python experiments/case_breakdown.py runs/invoice/sft-eval runs/invoice/rl-grpo-eval \
        --key problem
    python experiments/case_breakdown.py runs/invoice/sft-heldout-eval --key problem \
        --env-arg split=heldout

Prints one table (families as rows, folders as columns: success, episodes and the 95% Wilson
interval) and, with `--json`, writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from starpo.cli.args import parse_env_args
from starpo.envs import make
from starpo.errors import UserError
from starpo.stats import wilson_interval


def families(folder: Path, key: str, env_kwargs: dict[str, Any]) -> dict[str, list[bool]]:
    """Each episode's success in `folder`'s trajectories.jsonl, by its case's `key`."""
    path = folder / "trajectories.jsonl"
    if not path.is_file():
        raise UserError(f"{path} not found: pass folders that `starpo eval` wrote")
    by_family: dict[str, list[bool]] = defaultdict(list)
    envs: dict[str, Any] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        env_id = record["env_id"]
        env = envs.setdefault(env_id, make(env_id, **env_kwargs))
        _, info = env.reset(seed=record["seed"])
        if key not in info:
            raise UserError(f"{env_id}'s reset info has no {key!r}; it has: {', '.join(info)}")
        by_family[str(info[key])].append(bool(record["success"]))
    return dict(by_family)


def breakdown(folders: list[Path], key: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """{family: {folder: {success, episodes, ci95}}} over all folders' families."""
    table: dict[str, dict[str, Any]] = defaultdict(dict)
    for folder in folders:
        for family, wins in families(folder, key, env_kwargs).items():
            low, high = wilson_interval(sum(wins), len(wins))
            table[family][str(folder)] = {
                "success": sum(wins) / len(wins),
                "episodes": len(wins),
                "ci95": [low, high],
            }
    return dict(sorted(table.items()))


def show(table: dict[str, Any], folders: list[Path]) -> str:
    width = max([len("family"), *(len(f) for f in table)]) + 2
    lines = [f"{'family':<{width}}" + "".join(f"{f.name:>30}" for f in folders)]
    for family, cells in table.items():
        row = f"{family:<{width}}"
        for folder in folders:
            cell = cells.get(str(folder))
            if cell is None:
                row += f"{'-':>30}"
                continue
            low, high = cell["ci95"]
            text = f"{cell['success']:.0%} of {cell['episodes']} ({low:.0%}-{high:.0%})"
            row += f"{text:>30}"
        lines.append(row)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="`starpo eval` output folders")
    parser.add_argument("--key", required=True, help="the reset info's key to group by")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    try:
        table = breakdown(args.folders, args.key, parse_env_args(args.env_arg))
    except UserError as exc:
        print(f"case_breakdown: error: {exc}", file=sys.stderr)
        return 2
    print(show(table, args.folders))
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
