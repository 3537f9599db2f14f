"""`starpo sft`: supervised fine-tuning on trajectories before RL (wired into `starpo.cli`).

Settings come, in this order of precedence, from the flags, from `--config` (a `starpo
train` config or preset: its rollout section, env and model, so SFT lays examples out
exactly as that RL run will), and from the defaults.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from starpo.cli.args import (
    MAX_EPISODES,
    add_env_arg_flag,
    add_setting_flags,
    check_seed,
    flag_name,
    parse_env_args,
)
from starpo.config.episode import LAYOUT_SETTINGS
from starpo.errors import UserError

DESCRIPTION = """\
Supervised fine-tuning of a causal LM on agent trajectories, so a small model learns the
turn format and a good policy before RL. Records (trajectories.jsonl files of `starpo eval`
or `starpo train`, and/or solver episodes played with --from-solver) are replayed through
the rollout engine with the RL run's settings, so each example is token for token an RL
rollout; the loss is the NLL of the agent's tokens. A solver turn reads
"<think> {the env's rationale} </think> <answer> A1 || A2 </answer>" (without think:
"<answer> A1 || A2 </answer>"); a --from-world-model turn "<think> <observation>{state}
</observation> <prediction>{next state}</prediction> </think> <answer> A1 </answer>".
Writes a Hugging Face model folder (usable as `starpo train model.name=OUT` and `starpo
eval --model OUT`), sft_summary.json and the replayed examples, sft_data.jsonl."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `sft` command to `starpo`'s subparsers; returns its parser."""
    from starpo.config.episode import EpisodeSettings
    from starpo.defaults import WEAK_SKILL
    from starpo.sft.data import SOLVER_SEED_START, validation_seeds
    from starpo.sft.options import TrainOptions

    p = subparsers.add_parser(
        "sft",
        help="supervised fine-tuning on trajectories (e.g. the solver's) before RL",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "data",
        nargs="*",
        metavar="TRAJECTORIES",
        help="trajectories.jsonl files or `starpo eval --out` folders",
    )
    p.add_argument("--out", required=True, help="output folder (model, sft_summary.json, data)")
    p.add_argument(
        "--model", default=None, help="model to fine-tune (default: --config's, else the default)"
    )
    p.add_argument(
        "--config",
        default=None,
        help="a `starpo train` config or preset whose rollout settings, env and model to use",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu; training in fp32)")
    p.add_argument("--quiet", action="store_true", help="no progress bars and per-epoch lines")

    val = validation_seeds()
    g = p.add_argument_group("data")
    g.add_argument(
        "--from-solver",
        type=int,
        default=0,
        metavar="N",
        help=f"also play the solver on N seeds from --seed-start (default {SOLVER_SEED_START}: "
        f"clear of the validation seeds {val.start}..{val.stop - 1} and of RL's training "
        f"seeds from 10000)",
    )
    g.add_argument(
        "--from-random",
        type=int,
        default=0,
        metavar="N",
        help="also play the uniform random policy on N seeds after --from-solver's: a "
        "format-only warm start (well-formed turns, no solving shown); all kept, whatever "
        "their outcome, unless --only-success",
    )
    g.add_argument(
        "--from-weak",
        type=int,
        default=0,
        metavar="N",
        help="also play the weak policy (the solver's move with probability --weak-skill, "
        "else a random one) on N seeds after --from-random's: a weak warm start that RL can "
        "sharpen; all kept, whatever their outcome, unless --only-success",
    )
    g.add_argument(
        "--from-world-model",
        type=int,
        default=0,
        metavar="N",
        help="also play the uniform random policy on N seeds after --from-weak's, each turn's "
        "think block reading the state back and predicting the next one (SPA's "
        "<observation>...</observation> <prediction>...</prediction>): a world-model warm "
        "start; needs thinking on; all kept, whatever their outcome, unless --only-success",
    )
    g.add_argument(
        "--weak-skill",
        type=float,
        default=WEAK_SKILL,
        metavar="P",
        help="share of --from-weak's moves that are the solver's (default %(default)s)",
    )
    g.add_argument(
        "--env",
        default=None,
        help="env of --from-solver / --from-random / --from-weak / --from-world-model "
        "(default: --config's)",
    )
    g.add_argument(
        "--seed-start",
        type=int,
        default=SOLVER_SEED_START,
        help=f"first seed of --from-solver (default {SOLVER_SEED_START})",
    )
    add_env_arg_flag(
        g, "env constructor argument for solver play and replay (repeatable), e.g. size=6"
    )
    g.add_argument(
        "--actions-per-turn",
        type=int,
        default=1,
        metavar="K",
        help="actions per turn of a solver episode (default 1)",
    )
    g.add_argument(
        "--only-success",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep successful episodes only; --no-only-success keeps all (default: all of "
        "the solver's, whose actions are optimal even when the env's ice made it fail; only "
        "successful ones of any other policy)",
    )
    add_setting_flags(  # default None: from --config, else the setting's own
        p.add_argument_group("layout (as the RL run's rollout.* settings)"),
        EpisodeSettings,
        names=LAYOUT_SETTINGS,
        defaults=dict.fromkeys(LAYOUT_SETTINGS),
        shown=lambda name, _: (
            f"default: --config's, else {EpisodeSettings.model_fields[name].default}"
        ),
    )
    add_setting_flags(p.add_argument_group("training"), TrainOptions)
    p.set_defaults(func=cmd_sft)
    return p


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """`run_sft` keyword arguments from the flags, then --config, then defaults."""
    from starpo.config.episode import EpisodeSettings, check_settings
    from starpo.defaults import DEFAULT_MODEL
    from starpo.envs.policies import check_skill
    from starpo.sft.options import TrainOptions

    values: dict[str, Any] = {}
    model, env_id, env_kwargs = DEFAULT_MODEL, None, {}
    if args.config:
        from starpo.config import load_config

        cfg = load_config(args.config)
        values = cfg.rollout.settings().model_dump()
        model, env_id, env_kwargs = cfg.model.name, cfg.env.id, dict(cfg.env.kwargs)
    check_seed("--seed-start", args.seed_start)
    check_seed("--seed", args.seed)
    flags = {name: getattr(args, name) for name in LAYOUT_SETTINGS}
    values.update({k: v for k, v in flags.items() if v is not None})
    check_settings(values, spell=flag_name)
    options = TrainOptions(**{name: getattr(args, name) for name in TrainOptions.model_fields})
    if args.actions_per_turn < 1:
        raise UserError(f"--actions-per-turn must be >= 1, got {args.actions_per_turn}")
    for flag in ("from_solver", "from_random", "from_weak", "from_world_model"):
        if not 0 <= getattr(args, flag) <= MAX_EPISODES:
            raise UserError(
                f"--{flag.replace('_', '-')} must be between 0 and {MAX_EPISODES}, got "
                f"{getattr(args, flag)}"
            )
    return dict(
        model=args.model or model,
        data=list(args.data),
        settings=EpisodeSettings(**values),
        out=args.out,
        options=options,
        actions_per_turn=args.actions_per_turn,
        only_success=args.only_success,
        from_solver=args.from_solver,
        from_random=args.from_random,
        from_weak=args.from_weak,
        weak_skill=check_skill(args.weak_skill),
        from_world_model=args.from_world_model,
        env_id=args.env or env_id,
        seed_start=args.seed_start,
        env_kwargs={**env_kwargs, **parse_env_args(args.env_arg)},
        device=args.device,
        quiet=args.quiet,
    )


def cmd_sft(args: argparse.Namespace) -> int:
    """Run `starpo sft`; prints a one-screen summary."""
    from starpo.runs import check_writable
    from starpo.sft.run import DATA_FILE, SUMMARY_FILE, run_sft

    kwargs = resolve(args)
    check_writable(Path(args.out), "output folder")  # before any episode or model
    summary = run_sft(**kwargs)
    print(format_summary(summary))
    out = summary["out"]
    print(f"wrote the model to {out}/ with {SUMMARY_FILE} and {DATA_FILE}")
    return 0


def format_summary(summary: dict[str, Any]) -> str:
    """Data counts, the loss per epoch, and time: one screen."""
    data = summary["data"]
    lines = [
        f"records {data['records']}, kept {data['kept']} "
        f"({data['train_examples']} train, {data['val_examples']} val), "
        f"{data['tokens']} tokens ({data['agent_tokens']} agent)",
    ]
    lines += [f"  skipped {n}: {reason}" for reason, n in data["skipped"].items()]
    lines.append(
        f"{'epoch':>5}  {'train loss':>10}  {'train acc':>9}  {'turns':>6}  "
        f"{'val loss':>8}  {'val acc':>7}  {'turns':>6}"
    )
    for row in summary["epochs"]:
        train = (
            f"{row['train_loss']:>10.4f}  {row['train_accuracy']:>9.1%}  "
            f"{row.get('train_turn_accuracy', math.nan):>6.1%}"
            if "train_loss" in row
            else f"{'-':>10}  {'-':>9}  {'-':>6}"
        )
        val = (
            f"{row['val_loss']:>8.4f}  {row['val_accuracy']:>7.1%}  "
            f"{row.get('val_turn_accuracy', math.nan):>6.1%}"
            if "val_loss" in row
            else f"{'-':>8}  {'-':>7}  {'-':>6}"
        )
        lines.append(f"{row['epoch']:>5}  {train}  {val}")
    lines.append(
        "(acc: agent tokens that are the model's top choice; turns: replies whose every token is)"
    )
    seconds = summary["seconds"]
    lines.append(f"time {seconds['total']:.1f} s (training {seconds['training']:.1f} s)")
    trained = [row for row in summary["epochs"] if "peak_share" in row]
    if trained:  # GFLOP/s over all epochs: total FLOPs over total seconds
        spent = sum(row["seconds"] for row in trained)
        gflops = sum(row["gflops"] * row["seconds"] for row in trained) / spent
        peak, dtype = trained[-1]["matmul_peak_gflops"], trained[-1]["dtype"]
        lines.append(
            f"training speed {gflops:.1f} GFLOP/s = {gflops / peak:.0%} of the {dtype} "
            f"matmul peak ({peak:.1f} GFLOP/s, starpo.compute.flops)"
        )
    return "\n".join(lines)
