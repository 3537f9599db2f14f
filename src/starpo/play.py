"""`starpo play`: a person plays an env in the terminal, typing actions."""

from __future__ import annotations

import sys
from typing import TextIO

from starpo.envs import TextEnv

QUIT_WORDS = {"quit", "exit", "q"}


def describe(env: TextEnv) -> str:
    """The task as a player sees it: instruction, legend, actions."""
    lines = [env.instruction]
    if env.legend:
        lines.append(f"Symbols: {env.legend_text()}")
    lines.append(f"Actions: {', '.join(env.action_names)} (type one per line, 'quit' to stop)")
    return "\n".join(lines)


def play_interactive(
    env: TextEnv, *, seed: int | None = None, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout
) -> int:
    """Play one episode reading actions from `stdin`; returns the exit code (0)."""
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
        obs, reward, terminated, truncated, info = env.step(line.strip())
        if not info["action_is_valid"]:
            print(
                f"not an action: {line.strip()!r:.60}; choose one of {', '.join(env.action_names)}",
                file=stdout,
            )
            continue
        total += reward
        print(f"{obs}\nreward {reward:+g} (total {total:+g})", file=stdout)
        if terminated or truncated:
            outcome = "SUCCESS" if info["success"] else "failure"
            reason = "out of actions" if truncated else "episode over"
            print(f"{reason}: {outcome}, total reward {total:+g}", file=stdout)
            return 0
