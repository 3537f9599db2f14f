"""Does a FrozenLake agent read the map? The share of its moves on a shortest path to the
goal, per saved step of a run, against what uniform random moves would score there.

    python experiments/frozenlake_moves.py runs/fl-random-16x4/rl-grpo
    python experiments/frozenlake_moves.py runs/fl-random-16x4/rl-grpo --train

Success moves little while a policy learns to read the map (a good move is undone by the
next bad one), and a template-collapsed policy can keep its success by luck; this reads the
moves themselves. For every turn of the saved episodes (`val_trajectories/`, or with
`--train` the training rollouts a step logged) it parses the map the turn was shown and
counts the turn's first action as good when it leads one cell closer to the goal around
the holes (the env's `good_actions`; runs made since it exists also log the rate live as
`train/frozenlake/optimal_action_rate` and `val/...`, over every action). The random
column is the share of the four actions that would have been good, averaged over the same
turns: a policy that ignores the map scores about that when it picks uniformly, and less
when it favours one action (it ends up pressed against a wall, every turn wasted); a lift
above it means the moves follow the map.
Non-slippery maps only: on ice that slips, a good move is a distribution, not a cell.
"""

from __future__ import annotations

import argparse
import sys
from functools import lru_cache
from pathlib import Path

from starpo.envs.frozenlake.env import ACTIONS, FrozenLakeEnv
from starpo.runs import load_jsonl, step_files, warn_skipped

# Rendered symbols (TILE_SYMBOLS, PLAYER_SYMBOLS) -> map letters; the player's own cell
# is frozen ice (on a hole or the goal the episode has ended, so no move is asked there).
LETTERS = {"_": "F", "O": "H", "G": "G", "P": "F"}


def parse_map(state: str) -> tuple[tuple[str, ...], tuple[int, int]] | None:
    """(map rows in letters, player cell) of a rendered state, or None when the state
    shows no player on ice (a finished episode) or is not a map. Spaces between cells
    (`cell_sep=" "`) and a coordinates line below the map are ignored."""
    lines = [line.replace(" ", "") for line in state.strip().splitlines()]
    rows = [line for line in lines if line and set(line) <= set(LETTERS)]
    if not rows or len({len(row) for row in rows}) != 1:
        return None
    player = [(r, row.index("P")) for r, row in enumerate(rows) if "P" in row]
    if len(player) != 1:
        return None
    return tuple("".join(LETTERS[cell] for cell in row) for row in rows), player[0]


#: A move budget no path on a small map needs: with it the env's judgement is "a cell
#: closer to the goal around the holes", whatever the turn's own budget was.
JUDGE_BUDGET = 100


@lru_cache(maxsize=4096)  # an episode's turns all show one map: each cell is judged once
def good_actions(rows: tuple[str, ...], player: tuple[int, int]) -> frozenset[str]:
    """The actions that lead one move closer to the goal (empty when none can reach it):
    the env's own judgement (`FrozenLakeEnv.good_actions` on dry ice), the map's start
    moved to the player's cell."""
    desc = [list(row) for row in rows]
    desc[player[0]][player[1]] = "S"
    env = FrozenLakeEnv(is_slippery=False, max_steps=JUDGE_BUDGET)
    env.reset(options={"desc": ["".join(row) for row in desc]})
    return env.good_actions() or frozenset()


def move_quality(trajectories: list[dict]) -> dict[str, float]:
    """Turns read, the share whose first action was good, and the share uniform random
    actions would have had on the same turns (turns whose map cannot reach the goal, or
    that answered no action, are left out; the latter are counted)."""
    turns = good = 0
    random_share = 0.0
    unanswered = 0
    for trajectory in trajectories:
        for turn in trajectory["turns"]:
            parsed = parse_map(turn["state"])
            if parsed is None:
                continue
            wanted = good_actions(*parsed)
            if not wanted:
                continue
            if not turn["actions"]:
                unanswered += 1
                continue
            turns += 1
            good += turn["actions"][0] in wanted
            random_share += len(wanted) / len(ACTIONS)
    return {
        "turns": turns,
        "good": good / turns if turns else 0.0,
        "random": random_share / turns if turns else 0.0,
        "unanswered": unanswered,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a FrozenLake run's folder")
    parser.add_argument("--train", action="store_true", help="the logged training rollouts")
    args = parser.parse_args(argv)
    folder = args.run / ("trajectories" if args.train else "val_trajectories")
    files = step_files(folder)
    if not files:
        print(f"error: no step_*.jsonl in {folder}; pass a run folder of `starpo train`",
              file=sys.stderr)  # fmt: skip
        return 2
    print("step   turns  good moves  random would  lift  no action")
    for step, path in files:
        read = load_jsonl(path, skip_broken=True)
        warn_skipped(read)
        quality = move_quality(read.records)
        lift = quality["good"] - quality["random"]
        print(f"{step:>4}  {quality['turns']:>6}  {quality['good']:>10.1%}  "
              f"{quality['random']:>12.1%}  {lift:+.1%}  {quality['unanswered']:>9}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
