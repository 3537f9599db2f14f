"""The `starpo` command: envs, check-env, play, eval.

User mistakes (unknown env id, bad argument) print one line and exit with code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from starpo.cli_args import (
    check_seed,
    parse_env_args,
)
from starpo.cli_eval import add_model_eval_args, cmd_eval
from starpo.cli_eval_api import add_api_eval_args, cmd_eval_api
from starpo.errors import UserError


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


def cmd_play(args: argparse.Namespace) -> int:
    from starpo.envs import make
    from starpo.play import play_interactive

    check_seed("--seed", args.seed)
    env = make(args.env_id, **parse_env_args(args.env_arg))
    try:
        return play_interactive(env, seed=args.seed)
    finally:
        env.close()


def start_or_resume(out: Path, mode: str | None, overwrite: bool) -> tuple[bool, str | None]:
    """Whether to resume, and a line to say why, for `starpo train --out OUT`.

    `--resume`: resume (the trainer refuses when there is no checkpoint). `--resume auto`:
    resume when a checkpoint exists, else start fresh (a job scheduler's restart loop).
    Without either, a folder that holds a run is refused unless `--overwrite`, which
    removes that run's outputs first (a fresh start never mixes with an older run's files).
    """
    from starpo.runs import RunFolder
    from starpo.trainer.checkpoint import latest_checkpoint

    folder = RunFolder(out)
    if mode == "latest":
        return True, None
    if mode == "auto":
        found = latest_checkpoint(out)
        if found is not None:
            return True, f"--resume auto: continuing from {found}"
        said = f"--resume auto: no checkpoint in {folder.checkpoints}; starting fresh"
        if folder.holds_run():
            folder.clear()
            said += " (the unfinished run's files were removed)"
        return False, said
    earlier = folder.holds_run()
    if earlier and not overwrite:
        raise UserError(
            f"{out} already holds a run ({', '.join(earlier)}); continue it with --resume "
            "(or --resume auto), or start over with --overwrite"
        )
    if earlier:
        folder.clear()
        return False, f"--overwrite: removed the earlier run's {', '.join(earlier)} in {out}"
    return False, None


def cmd_train(args: argparse.Namespace) -> int:
    from starpo.config import load_config

    out = Path(args.out)
    mode = args.resume
    config_path = args.config  # a YAML path or a preset name (see starpo.config.presets)
    if config_path is None and mode and (out / "config.yaml").is_file():
        config_path = out / "config.yaml"  # resume with the config the run was saved with
    cfg = load_config(config_path, args.overrides)  # a bad config fails before files change
    from starpo.envs import make

    # A wrong env id or argument fails in one line here, in a second, before torch loads.
    make(cfg.env.id, **cfg.env.kwargs)
    make(cfg.env.validation_id, **cfg.env.validation_kwargs)
    if cfg.trainer.memory_check:
        from starpo.planning_fit import check_fits

        check_fits(cfg)  # before any file changes or any model loads
    resume, said = start_or_resume(out, mode, args.overwrite)
    if said:
        print(said, file=sys.stderr)
    from starpo.trainer.loop import Trainer

    trainer = Trainer(cfg, out, resume=resume, quiet=args.quiet)
    history = trainer.train()
    print(format_training_summary(cfg, history, out))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from starpo.config import load_config
    from starpo.planning import plan_config
    from starpo.planning_fit import format_plan, machine_memory

    cfg = load_config(args.config, args.overrides)
    print(format_plan(plan_config(cfg), machine_memory()))
    return 0


def format_training_summary(cfg: Any, history: list[dict[str, Any]], out: Path) -> str:
    """Validation success before and after, with 95% intervals, and where things are."""
    key = f"val/{cfg.env.validation_id}"
    validated = [h for h in history if f"{key}/success" in h]
    lines = [f"run folder: {out}  (metrics.jsonl, checkpoints/, final/)"]
    for label, entry in (("first", validated[:1]), ("last", validated[-1:])):
        for h in entry:
            lines.append(
                f"validation at step {h['step']:>4} ({label}): success "
                f"{h[f'{key}/success']:.1%} (95% CI {h[f'{key}/success_ci95_low']:.1%} - "
                f"{h[f'{key}/success_ci95_high']:.1%}), format ok {h[f'{key}/format_ok']:.1%}"
            )
    return "\n".join(lines)


def cmd_view(args: argparse.Namespace) -> int:
    from starpo.viewer import view_main

    return view_main(args.run, serve=args.serve, port=args.port)


def cmd_report(args: argparse.Namespace) -> int:
    from starpo.viewer.report import report_main

    return report_main(args.runs, args.out, args.x)


def _cmd_eval(args: argparse.Namespace) -> int:
    return (cmd_eval_api if args.policy == "api" else cmd_eval)(args)


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

    from starpo.defaults import VALIDATION_SEED_START

    p = sub.add_parser("eval", help="evaluate a policy on fixed validation seeds")
    p.add_argument("--env", required=True, help="a registered env id (see `starpo envs`)")
    p.add_argument(
        "--policy",
        required=True,
        choices=["random", "solver", "model", "api"],
        help="random: uniform actions; solver: the optimal policy; model: an LLM (--model); "
        "api: an OpenAI-compatible chat endpoint (--base-url)",
    )
    p.add_argument(
        "--episodes", type=int, default=100, help="number of validation seeds (default 100)"
    )
    p.add_argument("--out", required=True, help="output folder for summary.json and trajectories")
    p.add_argument(
        "--seed-start",
        type=int,
        default=VALIDATION_SEED_START,
        help="first validation seed; episode i uses seed-start + i (default %(default)s)",
    )
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help=env_arg_help)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_eval_args(p)
    add_api_eval_args(p)
    p.set_defaults(func=_cmd_eval)

    from starpo.config import format_config_help, presets

    p = sub.add_parser(
        "train",
        help="train an agent with StarPO / StarPO-S",
        description="Train with a YAML config (or a preset shipped with starpo) and dotted "
        "overrides, e.g. starpo train --config cpu-bandit-starpo-s optim.actor_lr=1e-5 "
        "--out runs/demo",
        epilog="config options (KEY=VALUE overrides):\n" + format_config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        help="YAML file, or a preset: " + ", ".join(presets()) + " (default: built-ins)",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides (anywhere)"
    )
    p.add_argument("--out", required=True, help="run folder (metrics, checkpoints, final model)")
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        choices=("latest", "auto"),
        help="continue from the latest checkpoint (an error when there is none); "
        "--resume auto: continue when one exists, else start fresh (for restart loops)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start fresh in a folder that holds a run: its metrics, trajectories, "
        "checkpoints and final model are removed first",
    )
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    p.set_defaults(func=cmd_train)

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

    from starpo.sft.command import add_sft_parser

    add_sft_parser(sub)  # `starpo sft`: its flags live beside the code they drive

    from starpo.serve.command import add_serve_parser

    add_serve_parser(sub)  # `starpo serve`: an OpenAI-compatible endpoint

    from starpo.serve.env_command import add_serve_env_parser

    add_serve_env_parser(sub)  # `starpo serve-env`: an env as an OpenEnv server

    p = sub.add_parser("view", help="write a static HTML viewer of a run or eval folder")
    p.add_argument("run", metavar="RUN", help="a training run folder or a starpo eval --out folder")
    p.add_argument("--serve", action="store_true", help="also serve it on 127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="port for --serve (default: any free)")
    p.set_defaults(func=cmd_view)

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
