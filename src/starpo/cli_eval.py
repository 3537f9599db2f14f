"""`starpo eval`: play an env with a scripted policy (random, solver) or a model, and
print and write the summary (success with its 95% interval, format, lengths). Its
per-episode flags are built from `RolloutSettings`, the settings' one definition."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from starpo.cli_args import (
    MAX_EPISODES,
    add_decode_flags,
    check_seed,
    flag_name,
    parse_env_args,
    setting_flag_kind,
)
from starpo.errors import UserError


def cmd_eval(args: argparse.Namespace) -> int:
    from starpo.evaluation import play_episodes, summarise, write_results
    from starpo.runs import check_writable

    if not 1 <= args.episodes <= MAX_EPISODES:
        raise UserError(f"--episodes must be between 1 and {MAX_EPISODES}, got {args.episodes}")
    check_seed("--seed-start", args.seed_start)
    env_kwargs = parse_env_args(args.env_arg)
    if args.policy == "model":
        return _eval_model(args, env_kwargs)
    episodes_iter = play_episodes(
        args.env, args.policy, args.episodes, seed_start=args.seed_start, env_kwargs=env_kwargs
    )
    out = Path(args.out)
    check_writable(out, "output folder")  # the env and policy are fine: before any episode
    episodes = list(_progress(episodes_iter, args, total=args.episodes))
    summary = {
        "env": args.env,
        "policy": args.policy,
        "seed_start": args.seed_start,
        **summarise(episodes),
    }
    write_results(out, episodes, summary)
    print(format_summary(summary))
    print(f"wrote {out / 'summary.json'} and {out / 'trajectories.jsonl'}")
    return 0


def _progress(iterable: Any, args: argparse.Namespace, total: int) -> Any:
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=f"eval {args.env}", unit="ep", disable=args.quiet)


def _rollout_settings_from_args(args: argparse.Namespace) -> Any:
    """The `RolloutSettings` of `--policy model`: each setting from its flag (the others at
    their defaults), checked by the settings' own bounds; an error names the flag."""
    from dataclasses import fields

    from starpo.config_episode import RolloutSettings, check_settings
    from starpo.rollout.evaluate import default_max_new_tokens

    for name in ("samples_per_seed", "batch_size"):  # eval's own, not per-episode settings
        if getattr(args, name) < 1:
            raise UserError(f"{flag_name(name)} must be >= 1, got {getattr(args, name)}")
    if args.episodes * args.samples_per_seed > MAX_EPISODES:
        raise UserError(
            f"--episodes x --samples-per-seed is {args.episodes * args.samples_per_seed} "
            f"episodes; play at most {MAX_EPISODES} in one eval"
        )
    values = {f.name: getattr(args, f.name) for f in fields(RolloutSettings) if f.name in args}
    if values.get("max_new_tokens") is None:  # not given: the think mode decides
        values["max_new_tokens"] = default_max_new_tokens(values["think"])
    check_settings(values, spell=flag_name)
    return RolloutSettings(**values)


def _eval_model(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> int:
    from starpo.envs import make
    from starpo.envs.policies import has_solver
    from starpo.evaluation import play_episodes, summarise, write_results
    from starpo.rollout.evaluate import evaluate_model, progress_bar
    from starpo.runs import check_writable

    settings = _rollout_settings_from_args(args)
    env = make(args.env, **env_kwargs)  # bad env ids and arguments fail first
    out = Path(args.out)
    check_writable(out, "output folder")  # before the model loads
    seeds = list(range(args.seed_start, args.seed_start + args.episodes))
    if not args.quiet:
        print(f"eval {args.env} with {args.model}: {_mode(asdict(settings))}")
    bar, show = progress_bar(
        len(seeds) * args.samples_per_seed, f"eval {args.env}", disable=args.quiet
    )
    with bar:
        result, summary = evaluate_model(
            args.env,
            args.model,
            seeds,
            settings,
            samples_per_seed=args.samples_per_seed,
            batch_size=args.batch_size,
            device=args.device,
            backend=args.backend,
            dtype=args.dtype,
            seed=args.seed_start,
            env_kwargs=env_kwargs,
            on_turn=show,
        )
    summary = {
        "env": args.env,
        "policy": "model",
        "model": args.model,
        "seed_start": args.seed_start,
        "settings": asdict(settings),
        **summary,
    }
    # Reference policies on the same seeds, for the comparison table.
    baselines = ["random", "solver"] if has_solver(env) else ["random"]
    summary["baselines"] = {
        name: summarise(
            list(
                play_episodes(
                    args.env, name, args.episodes, seed_start=args.seed_start, env_kwargs=env_kwargs
                )
            )
        )
        for name in baselines
    }
    write_results(out, result.trajectories, summary)
    print(format_comparison(summary))
    print(f"wrote {out / 'summary.json'} and {out / 'trajectories.jsonl'}")
    return 0


def _mode(settings: dict[str, Any]) -> str:
    """E.g. "no think, at most 64 new tokens a turn": what bounds the cost of a turn."""
    think = "think" if settings["think"] else "no think"
    return f"{think}, at most {settings['max_new_tokens']} new tokens a turn"


def format_comparison(summary: dict[str, Any]) -> str:
    """The model beside the reference policies on the same seeds, then the model's details."""
    rows = [("model", summary)] + list(summary["baselines"].items())
    mode = _mode(summary["settings"])
    lines = [
        f"{summary['env']}: {summary['num_episodes']} episodes, model {summary['model']}, {mode}",
        f"{'policy':<8}{'success':>9}  {'95% CI':<17}{'reward':>8}{'valid':>8}",
    ]
    for name, s in rows:
        low, high = s["success_ci95_low"], s["success_ci95_high"]
        lines.append(
            f"{name:<8}{s['success']:>9.1%}  {f'{low:.1%} - {high:.1%}':<17}"
            f"{s['reward']:>8.3f}{s['valid_action_rate']:>8.1%}"
        )
    passes = "  ".join(f"{k} {v:.1%}" for k, v in summary.items() if k.startswith("pass@"))
    lines += [
        f"model: {passes}; format ok {summary['format_ok']:.1%} of turns; "
        f"{summary['num_turns']:.2f} turns/episode",
        f"model: {summary['mean_response_tokens']:.1f} response tokens/turn, "
        f"{summary['mean_think_tokens']:.1f} think tokens/turn, "
        f"{summary['generation_tokens_per_s']:.1f} generated tokens/s",
    ]
    return "\n".join(lines)


def format_summary(summary: dict[str, Any]) -> str:
    """A small table: success with its 95% interval, reward, actions, optimal success."""
    low, high = summary["success_ci95_low"], summary["success_ci95_high"]
    optimal = summary.get("optimal_success")
    rows = [
        ("env", summary["env"]),
        ("policy", summary["policy"]),
        ("episodes", str(summary["num_episodes"])),
        ("success", f"{summary['success']:.1%}  (95% CI {low:.1%} - {high:.1%})"),
        ("mean reward", f"{summary['reward']:.3f}"),
        ("mean actions", f"{summary['num_actions']:.2f}"),
        ("valid actions", f"{summary['valid_action_rate']:.1%}"),
        ("optimal success", "n/a" if optimal is None else f"{optimal:.1%}"),
    ]
    return "\n".join(f"{name:<16}{value}" for name, value in rows)


def add_model_eval_args(p: argparse.ArgumentParser) -> None:
    """Options of `--policy model` (defaults: the RAGEN paper's evaluation settings)."""
    from starpo.defaults import DEFAULT_MODEL

    g = p.add_argument_group("model policy (--policy model)")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model name, local folder or hub id (default {DEFAULT_MODEL})",
    )
    add_decode_flags(g)
    g.add_argument(
        "--samples-per-seed",
        type=int,
        default=1,
        help="episodes per seed; pass@k is reported for k up to this (default 1)",
    )
    g.add_argument(
        "--batch-size", type=int, default=32, help="episodes generated together (default 32)"
    )
    # Evaluation samples at 0.5 (RAGEN); the token budget follows --think when not given.
    _add_settings_flags(g, {"temperature": 0.5, "max_new_tokens": None})


def _add_settings_flags(group: Any, defaults: dict[str, Any]) -> None:
    """One flag per per-episode setting, from its one definition (`RolloutSettings`:
    help, default; bounds are checked by `_rollout_settings_from_args`)."""
    from dataclasses import fields

    from starpo.config_episode import RolloutSettings
    from starpo.rollout.evaluate import default_max_new_tokens

    for f in fields(RolloutSettings):
        default = defaults.get(f.name, f.default)
        kind = setting_flag_kind(f.default)
        shown = default
        if f.name == "max_new_tokens" and default is None:  # see _rollout_settings_from_args
            shown = f"{default_max_new_tokens(True)} with --think, else "
            shown += str(default_max_new_tokens(False))
        help_text = f"{f.metadata['help']} (default {shown})".replace("%", "%%")
        group.add_argument(flag_name(f.name), default=default, help=help_text, **kind)
