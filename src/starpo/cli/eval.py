"""`starpo eval`: play an env with a scripted policy (random, solver) or a model, and
print and write the summary (success with its 95% interval, format, lengths). Its
per-episode flags are built from `EpisodeSettings`, the settings' one definition.

`--policy api`: an OpenAI-compatible chat model plays the env's validation
seeds with the rollout engine's prompts, parser and rewards (`starpo.evaluation.api`).

Each finished episode is appended to trajectories.jsonl as it ends, so `--resume` on an
interrupted run's folder plays only the seeds it lacks (episodes that failed on the API
are played again); the summary covers them all. What the episodes are played with (env,
its arguments, model, rollout settings, prefill) is written to eval_run.json first, and
`--resume` refuses a folder whose episodes were played with anything else. The API key is
read only from the environment variable `--api-key-env` names, and never printed or
written.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from pathlib import Path
from typing import Any

from starpo.cli.args import (
    MAX_EPISODES,
    add_decode_flags,
    add_env_arg_flag,
    add_setting_flags,
    check_seed,
    flag_name,
    parse_env_args,
)
from starpo.errors import UserError
from starpo.runs import EVAL_TRAJECTORIES_FILE


def cmd_eval(args: argparse.Namespace) -> int:
    from starpo.evaluation.scripted import play_episodes
    from starpo.evaluation.summary import summarise, write_results
    from starpo.runs import check_writable

    env_kwargs = parse_env_args(args.env_arg)
    if args.policy == "model":
        return _eval_model(args, env_kwargs)
    episodes_iter = play_episodes(
        args.env,
        args.policy,
        args.episodes,
        seed_start=args.seed_start,
        env_kwargs=env_kwargs,
        weak_skill=args.weak_skill,
    )
    out = Path(args.out)
    check_writable(out, "output folder")  # the env and policy are fine: before any episode
    episodes = list(_progress(episodes_iter, args, total=args.episodes))
    summary = {
        "env": args.env,
        "policy": args.policy,
        **({"weak_skill": args.weak_skill} if args.policy == "weak" else {}),
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
    """The `EpisodeSettings` of `--policy model`: each setting from its flag (the others at
    their defaults), checked by the settings' own bounds; an error names the flag."""
    from starpo.config.episode import EpisodeSettings, check_settings
    from starpo.evaluation.model import default_max_new_tokens

    for name in ("samples_per_seed", "batch_size"):  # eval's own, not per-episode settings
        if getattr(args, name) < 1:
            raise UserError(f"{flag_name(name)} must be >= 1, got {getattr(args, name)}")
    if args.episodes * args.samples_per_seed > MAX_EPISODES:
        raise UserError(
            f"--episodes x --samples-per-seed is {args.episodes * args.samples_per_seed} "
            f"episodes; play at most {MAX_EPISODES} in one eval"
        )
    values = {name: getattr(args, name) for name in EpisodeSettings.model_fields if name in args}
    if values.get("max_new_tokens") is None:  # not given: the think mode decides
        values["max_new_tokens"] = default_max_new_tokens(values["think"])
    check_settings(values, spell=flag_name)
    return EpisodeSettings(**values)


def _eval_model(args: argparse.Namespace, env_kwargs: dict[str, Any]) -> int:
    from starpo.envs import make
    from starpo.envs.policies import has_solver
    from starpo.evaluation.model import evaluate_model, progress_bar
    from starpo.evaluation.scripted import play_episodes
    from starpo.evaluation.summary import summarise, write_results
    from starpo.runs import check_writable

    settings = _rollout_settings_from_args(args)
    env = make(args.env, **env_kwargs)  # bad env ids and arguments fail first
    out = Path(args.out)
    check_writable(out, "output folder")  # before the model loads
    seeds = list(range(args.seed_start, args.seed_start + args.episodes))
    if not args.quiet:
        print(f"eval {args.env} with {args.model}: {_mode(settings.model_dump())}")
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
            kv_dtype=args.kv_dtype,
            seed=args.seed_start,
            env_kwargs=env_kwargs,
            on_turn=show,
        )
    summary = {
        "env": args.env,
        "policy": "model",
        "model": args.model,
        "seed_start": args.seed_start,
        "settings": settings.model_dump(),
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
    judged = any("optimal_action_rate" in s for _, s in rows)  # the env judges moves
    lines = [
        f"{summary['env']}: {summary['num_episodes']} episodes, model {summary['model']}, {mode}",
        f"{'policy':<8}{'success':>9}  {'95% CI':<17}{'reward':>8}{'valid':>8}"
        + (f"{'optimal':>9}" if judged else ""),
    ]
    for name, s in rows:
        low, high = s["success_ci95_low"], s["success_ci95_high"]
        optimal = s.get("optimal_action_rate")
        lines.append(
            f"{name:<8}{s['success']:>9.1%}  {f'{low:.1%} - {high:.1%}':<17}"
            f"{s['reward']:>8.3f}{s['valid_action_rate']:>8.1%}"
            + ((f"{optimal:>9.1%}" if optimal is not None else f"{'-':>9}") if judged else "")
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
    """One flag per per-episode setting, from its one declaration (`EpisodeSettings`;
    values are checked by `_rollout_settings_from_args`)."""
    from starpo.config.episode import EpisodeSettings
    from starpo.evaluation.model import default_max_new_tokens

    def shown(name: str, default: Any) -> str:
        if name == "max_new_tokens" and default is None:  # see _rollout_settings_from_args
            think, answer = default_max_new_tokens(True), default_max_new_tokens(False)
            return f"default {think} with --think, else {answer}"
        return f"default {default}"

    add_setting_flags(group, EpisodeSettings, defaults=defaults, shown=shown)


def add_api_eval_args(p: argparse.ArgumentParser) -> None:
    """Options of `--policy api` (the rollout settings are `--policy model`'s flags)."""
    g = p.add_argument_group("API policy (--policy api): any OpenAI-compatible chat endpoint")
    g.add_argument("--base-url", help="the API's base URL, e.g. http://127.0.0.1:8000/v1")
    g.add_argument(
        "--api-model",
        help="model name to ask for (default: the server's, when GET /models lists one)",
    )
    g.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key; unset = no auth (default %(default)s)",
    )
    g.add_argument(
        "--concurrency", type=int, default=8, help="episodes in flight at once (default 8)"
    )
    g.add_argument(
        "--request-timeout", type=float, default=60.0, help="seconds per request (default 60)"
    )
    g.add_argument(
        "--max-retries",
        type=int,
        default=4,
        help="retries of a request on 429, 5xx, timeouts and connection errors, with "
        "exponential backoff (the openai client's own) (default 4)",
    )
    g.add_argument(
        "--api-prefill",
        action="store_true",
        help="pre-fill the reply with <think> (or <answer>) as the engine does, with vLLM's "
        "continue_final_message (vLLM, starpo serve); without it the prefix is prepended to "
        "replies that lack it",
    )
    g.add_argument(  # `starpo` turns a bare --resume into --resume=latest (see cli.py)
        "--resume",
        nargs="?",
        const="latest",
        choices=["latest"],
        help="keep the finished episodes in --out's trajectories.jsonl and play the rest",
    )


def _check_args(args: argparse.Namespace) -> None:
    if not args.base_url:
        raise UserError("--policy api needs --base-url (e.g. http://127.0.0.1:8000/v1)")
    if args.concurrency < 1:
        raise UserError(f"--concurrency must be >= 1, got {args.concurrency}")
    if not args.request_timeout > 0:
        raise UserError(f"--request-timeout must be > 0, got {args.request_timeout}")
    if args.max_retries < 0:
        raise UserError(f"--max-retries must be >= 0, got {args.max_retries}")


def _finished(path: Path, env_id: str, seeds: range, samples: int) -> dict[int, list[Any]]:
    """The episodes of an interrupted run worth keeping, by seed: this env's, on these
    seeds, whole lines only, not ended by an API failure, at most `samples` a seed."""
    from starpo.types import Trajectory

    kept: dict[int, list[Any]] = {}
    if not path.exists():
        return kept
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            traj = Trajectory.from_json(line)
        except (ValueError, TypeError, KeyError):
            continue  # a line cut by the interruption, or another policy's record
        if traj.env_id == env_id and traj.seed in seeds:
            if not (traj.error or "").startswith("api:"):
                kept.setdefault(traj.seed, []).append(traj)
    return {seed: episodes[:samples] for seed, episodes in kept.items()}


def check_same_run(path: Path, played_with: dict[str, Any]) -> None:
    """A UserError when the run in `path`'s folder played its episodes with other settings
    than `played_with` (episodes of two setups must not be summarised as one), or when the
    folder has episodes but no record of how they were played."""
    if not path.exists():
        if (path.parent / EVAL_TRAJECTORIES_FILE).exists():
            raise UserError(
                f"--resume: {path.parent} has episodes but no {path.name} saying how they "
                "were played; run without --resume (to play them all again) or use a new --out"
            )
        return
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"--resume: cannot read {path} ({exc}); use a new --out") from None
    changed = sorted(k for k in played_with if before.get(k) != _json_roundtrip(played_with[k]))
    if changed:
        raise UserError(
            f"--resume: {path.parent}'s episodes were played with another {', '.join(changed)}; "
            "resume with the same flags, or use a new --out"
        )


def _json_roundtrip(value: Any) -> Any:
    """`value` as it reads back from JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def cmd_eval_api(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from starpo import runs
    from starpo.envs import make
    from starpo.evaluation.api import NO_KEY, ApiPlayer, check_server, make_client
    from starpo.evaluation.summary import summarise, write_results
    from starpo.runs import check_writable

    _check_args(args)
    env_kwargs = parse_env_args(args.env_arg)
    settings = _rollout_settings_from_args(args)
    make(args.env, **env_kwargs)  # bad env ids and arguments fail first
    out = Path(args.out)
    check_writable(out, "output folder")
    key = os.environ.get(args.api_key_env) or NO_KEY  # never a flag, never shown
    client = make_client(
        args.base_url, key, timeout_s=args.request_timeout, max_retries=args.max_retries
    )
    model = check_server(client, args.api_model, key_env=args.api_key_env)  # before any episode
    seeds = range(args.seed_start, args.seed_start + args.episodes)
    path = out / runs.EVAL_TRAJECTORIES_FILE
    played_with = {
        "env": args.env,
        "env_kwargs": env_kwargs,
        "model": model,
        "settings": settings.model_dump(),
        "api_prefill": args.api_prefill,
    }
    if args.resume:
        check_same_run(out / runs.EVAL_RUN_FILE, played_with)
    samples = args.samples_per_seed
    done = _finished(path, args.env, seeds, samples) if args.resume else {}
    kept = [t for episodes in done.values() for t in episodes]
    out.mkdir(parents=True, exist_ok=True)
    (out / runs.EVAL_RUN_FILE).write_text(json.dumps(played_with, indent=1), encoding="utf-8")
    path.write_text("".join(t.to_json() + "\n" for t in kept), encoding="utf-8")
    # One episode a sample; with temperature > 0 each request samples its own reply.
    todo = [seed for seed in seeds for _ in range(samples - len(done.get(seed, [])))]
    if not args.quiet:
        resumed = f", {len(kept)} episodes kept from before" if kept else ""
        mode = _mode(settings.model_dump())
        print(f"eval {args.env} with {model} at {args.base_url}: {mode}{resumed}")
    player = ApiPlayer(
        client, model, settings, concurrency=args.concurrency, prefill=args.api_prefill
    )
    lock = threading.Lock()
    bar = tqdm(total=len(todo), desc=f"eval {args.env}", unit="ep", disable=args.quiet)
    with bar, open(path, "a", encoding="utf-8") as sink:

        def finished(traj: Any) -> None:
            traj.group = traj.seed - args.seed_start  # one group a seed, over resumed runs too
            with lock:
                sink.write(traj.to_json() + "\n")
                sink.flush()
                bar.update(1)

        played = player.run(args.env, todo, 1, env_kwargs=env_kwargs, on_episode=finished)
    episodes = sorted([*kept, *played], key=lambda t: t.seed)
    summary = {
        "env": args.env,
        "policy": "api",
        "model": model,
        "base_url": args.base_url,
        "seed_start": args.seed_start,
        "settings": settings.model_dump(),
        **summarise(episodes),
        **_api_totals(episodes),
        "samples_per_seed": samples,
        "resumed_episodes": len(kept),
    }
    write_results(out, episodes, summary)
    print(format_summary(summary))
    print(
        f"api: {summary['api_errors']} failed episodes; {summary['prompt_tokens']} prompt + "
        f"{summary['completion_tokens']} completion tokens in {summary['requests']} requests"
    )
    print(f"wrote {out / 'summary.json'} and {out / 'trajectories.jsonl'}")
    return 0


def _api_totals(episodes: list[Any]) -> dict[str, Any]:
    """Failed episodes (env_errors counts env faults only), token and time totals."""
    api_errors = sum((t.error or "").startswith("api:") for t in episodes)
    usage = [t.usage or {} for t in episodes]
    return {
        "env_errors": sum(t.error is not None for t in episodes) - api_errors,
        "api_errors": api_errors,
        "prompt_tokens": sum(u.get("prompt_tokens", 0) for u in usage),
        "completion_tokens": sum(u.get("completion_tokens", 0) for u in usage),
        "requests": sum(u.get("requests", 0) for u in usage),
        "wall_s": sum(t.wall_s or 0.0 for t in episodes),
    }


def add_parser(sub: Any) -> None:
    from starpo.defaults import VALIDATION_SEED_START, WEAK_SKILL

    p = sub.add_parser("eval", help="evaluate a policy on fixed validation seeds")
    p.add_argument("--env", required=True, help="a registered env id (see `starpo envs`)")
    p.add_argument(
        "--policy",
        required=True,
        choices=["random", "solver", "weak", "model", "api"],
        help="random: uniform actions; solver: the optimal policy; weak: the solver's move "
        "with probability --weak-skill, else a random one; model: an LLM (--model); api: an "
        "OpenAI-compatible chat endpoint (--base-url)",
    )
    p.add_argument(
        "--weak-skill",
        type=float,
        default=WEAK_SKILL,
        metavar="P",
        help="share of --policy weak's moves that are the solver's (default %(default)s)",
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
    add_env_arg_flag(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_eval_args(p)
    add_api_eval_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """`starpo eval`: the checks every policy shares, then its command."""
    if not 1 <= args.episodes <= MAX_EPISODES:
        raise UserError(f"--episodes must be between 1 and {MAX_EPISODES}, got {args.episodes}")
    check_seed("--seed-start", args.seed_start)
    return (cmd_eval_api if args.policy == "api" else cmd_eval)(args)
