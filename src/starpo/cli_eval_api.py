"""`starpo eval --policy api`: an OpenAI-compatible chat model plays the env's validation
seeds with the rollout engine's prompts, parser and rewards (`starpo.rollout.api_player`).

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from starpo.cli_args import MAX_EPISODES, check_seed, parse_env_args
from starpo.errors import UserError
from starpo.runs import EVAL_TRAJECTORIES_FILE


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
    from starpo.cli_eval import _mode, _rollout_settings_from_args, format_summary
    from starpo.envs import make
    from starpo.evaluation import summarise, write_results
    from starpo.rollout.api_player import NO_KEY, ApiPlayer, check_server, make_client
    from starpo.runs import check_writable

    if not 1 <= args.episodes <= MAX_EPISODES:
        raise UserError(f"--episodes must be between 1 and {MAX_EPISODES}, got {args.episodes}")
    check_seed("--seed-start", args.seed_start)
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
        "settings": asdict(settings),
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
        print(
            f"eval {args.env} with {model} at {args.base_url}: {_mode(asdict(settings))}{resumed}"
        )
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
        "settings": asdict(settings),
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
