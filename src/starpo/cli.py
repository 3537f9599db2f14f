"""The `starpo` command: envs, check-env, play, eval.

User mistakes (unknown env id, bad argument) print one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from starpo.errors import UserError


def _parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """`--env-arg size=6 --env-arg p_frozen=0.9` -> {"size": 6, "p_frozen": 0.9} (YAML values)."""
    import yaml

    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--env-arg {pair!r} must look like KEY=VALUE, e.g. --env-arg size=6")
        parsed = yaml.safe_load(value) if value else ""
        kwargs[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    return kwargs


def cmd_envs(args: argparse.Namespace) -> int:
    from starpo.envs import registered_ids, spec

    ids = registered_ids()
    width = max(len(i) for i in ids)
    for env_id in ids:
        print(f"{env_id:<{width}}  {spec(env_id).summary()}")
    return 0


def cmd_check_env(args: argparse.Namespace) -> int:
    from starpo.envs import check_env, make
    from starpo.envs.checker import EnvCheckError

    env = make(args.env_id, **_parse_env_args(args.env_arg))
    try:
        passed = check_env(env)
    except EnvCheckError as exc:
        print(f"FAIL {args.env_id}: {exc}")
        return 1
    for name in passed:
        print(f"ok    {name}")
    print(f"PASS  {args.env_id}: all {len(passed)} checks passed")
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    from starpo.envs import make
    from starpo.play import play_interactive

    env = make(args.env_id, **_parse_env_args(args.env_arg))
    return play_interactive(env, seed=args.seed)


def cmd_eval(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from starpo.evaluation import play_episodes, summarise, write_results

    if args.episodes < 1:
        raise UserError(f"--episodes must be at least 1, got {args.episodes}")
    env_kwargs = _parse_env_args(args.env_arg)
    episodes_iter = play_episodes(
        args.env, args.policy, args.episodes, seed_start=args.seed_start, env_kwargs=env_kwargs
    )
    episodes = list(
        tqdm(
            episodes_iter,
            total=args.episodes,
            desc=f"eval {args.env}",
            unit="ep",
            disable=args.quiet,
        )
    )
    summary = {
        "env": args.env,
        "policy": args.policy,
        "seed_start": args.seed_start,
        **summarise(episodes),
    }
    out = Path(args.out)
    write_results(out, episodes, summary)
    print(format_summary(summary))
    print(f"wrote {out / 'summary.json'} and {out / 'trajectories.jsonl'}")
    return 0


def format_summary(summary: dict[str, Any]) -> str:
    """A small table: success with its 95% interval, reward, actions, optimal success."""
    low, high = summary["success_rate_ci95"]
    optimal = summary.get("optimal_success_rate")
    rows = [
        ("env", summary["env"]),
        ("policy", summary["policy"]),
        ("episodes", str(summary["num_episodes"])),
        ("success", f"{summary['success_rate']:.1%}  (95% CI {low:.1%} - {high:.1%})"),
        ("mean reward", f"{summary['mean_reward']:.3f}"),
        ("mean actions", f"{summary['mean_actions']:.2f}"),
        ("valid actions", f"{summary['valid_action_rate']:.1%}"),
        ("optimal success", "n/a" if optimal is None else f"{optimal:.1%}"),
    ]
    return "\n".join(f"{name:<16}{value}" for name, value in rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="starpo", description="Train and evaluate LLM agents with multi-turn RL (StarPO)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    env_arg_help = "env constructor argument KEY=VALUE (repeatable), e.g. size=6"

    p = sub.add_parser("envs", help="list the registered environment ids")
    p.set_defaults(func=cmd_envs)

    p = sub.add_parser("check-env", help="run the env checker on an env id (exit 0 = pass)")
    p.add_argument("env_id", help="a registered env id (see `starpo envs`)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help=env_arg_help)
    p.set_defaults(func=cmd_check_env)

    p = sub.add_parser("play", help="play an environment yourself in the terminal")
    p.add_argument("env_id", help="a registered env id (see `starpo envs`)")
    p.add_argument("--seed", type=int, default=None, help="seed of the episode (default: random)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help=env_arg_help)
    p.set_defaults(func=cmd_play)

    p = sub.add_parser("eval", help="evaluate a policy on fixed validation seeds")
    p.add_argument("--env", required=True, help="a registered env id (see `starpo envs`)")
    p.add_argument(
        "--policy",
        required=True,
        choices=["random", "solver"],
        help="random: uniform actions; solver: the optimal policy",
    )
    p.add_argument("--episodes", type=int, default=100, help="number of episodes (default 100)")
    p.add_argument("--out", required=True, help="output folder for summary.json and trajectories")
    p.add_argument(
        "--seed-start",
        type=int,
        default=123,
        help="first validation seed; episode i uses seed-start + i (default 123)",
    )
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help=env_arg_help)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
