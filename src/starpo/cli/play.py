"""`starpo play`: a person plays an env in the terminal, typing actions."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from starpo.cli.args import add_env_arg_flag, add_env_id_argument, check_seed, parse_env_args

if TYPE_CHECKING:  # every subcommand module loads with `starpo`: no numpy before it is used
    from starpo.envs import TextEnv

QUIT_WORDS = {"quit", "exit", "q"}


def describe(env: TextEnv) -> str:
    """The task as a player sees it: instruction, legend, actions."""
    lines = [env.instruction]
    if env.legend:
        lines.append(f"Symbols: {env.legend_text()}")
    lines.append(f"{choices(env)} (type one per line, 'quit' to stop)")
    return "\n".join(lines)


def choices(env: TextEnv) -> str:
    """What the player may type: the action names, a tool env's calls, or a free-text env's
    answer format."""
    from starpo.envs.tools import is_tool_env

    if is_tool_env(env):
        return (
            "Call a tool as NAME {JSON arguments}, e.g. "
            f"{env.tools[0].name} {{...}}, or as a whole JSON call. Tools: {tool_list(env)}"
        )
    if env.free_text:
        return f"Answer with {env.answer_format}"
    return f"Actions: {', '.join(env.action_names)}"


def tool_list(env: Any) -> str:
    """`name(arg, [optional arg])` of each tool of a tool env."""
    shown = []
    for tool in env.tools:
        properties = tool.parameters.get("properties", {})
        required = set(tool.parameters.get("required", ()))
        args = [name if name in required else f"[{name}]" for name in properties]
        shown.append(f"{tool.name}({', '.join(args)})")
    return ", ".join(shown)


def typed_call(line: str) -> str:
    """A tool call as the player typed it: `NAME {JSON arguments}` (arguments optional) as
    the JSON call the env reads; a line that starts with `{` is taken as the call itself."""
    import json

    name, _, rest = line.strip().partition(" ")
    if line.lstrip().startswith("{") or not name:
        return line.strip()
    try:
        arguments = json.loads(rest) if rest.strip() else {}
    except json.JSONDecodeError:
        return line.strip()  # the env says what is wrong with it
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def play_interactive(
    env: TextEnv, *, seed: int | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout
) -> int:
    """Play one episode reading actions from `stdin`; returns the exit code (0)."""
    from starpo.envs.tools import is_tool_env

    tools = is_tool_env(env)  # a line is a call: NAME {JSON arguments}
    obs, _ = env.reset(seed=seed)
    print(describe(env), file=stdout)
    print(f"\n{obs}", file=stdout)
    total = 0.0
    while True:
        print(f"[{env.steps_left} actions left] action> ", end="", file=stdout, flush=True)
        line = stdin.readline()
        if not line or line.strip().casefold() in QUIT_WORDS:
            print("\nstopped.", file=stdout)
            return 0
        action = typed_call(line) if tools else line.strip()
        obs, reward, terminated, truncated, info = env.step(action)
        if "tool_result" in info:  # a tool env answers every call, a bad one with "Error: ..."
            print(info["tool_result"], file=stdout)
            if not info["action_is_valid"]:
                continue
        elif not info["action_is_valid"]:
            print(
                f"not an action: {line.strip()!r:.60}. {choices(env)}",
                file=stdout,
            )
            continue
        total += reward
        shown = "" if "tool_result" in info else f"{obs}\n"  # a tool env's case stays as read
        print(f"{shown}reward {reward:+g} (total {total:+g})", file=stdout)
        if terminated or truncated:
            outcome = "SUCCESS" if info["success"] else "failure"
            reason = "out of actions" if truncated else "episode over"
            print(f"{reason}: {outcome}, total reward {total:+g}", file=stdout)
            return 0


def cmd_play(args: argparse.Namespace) -> int:
    from starpo.envs import make

    check_seed("--seed", args.seed)
    env = make(args.env_id, **parse_env_args(args.env_arg))
    try:
        return play_interactive(env, seed=args.seed)
    finally:
        env.close()


def add_parser(sub: Any) -> None:
    p = sub.add_parser("play", help="play an environment yourself in the terminal")
    add_env_id_argument(p)
    p.add_argument("--seed", type=int, default=None, help="seed of the episode (default: random)")
    add_env_arg_flag(p)
    p.set_defaults(func=cmd_play)
