"""Does a Bandit agent's answer follow its reasoning? Per validation step of a think run.

    python experiments/bandit_reasoning_agreement.py runs/echo-trap-bandit-think/starpo-s-seed1

The paper describes the Echo Trap as reasoning that shrinks or vanishes; a trace can also
stay while the answer stops following it. For every saved validation step
(`val_trajectories/step_*.jsonl`) this counts the replies by (the arm the think block argues
for, the arm answered) and how many answered the arm listed first in the prompt (the
position shortcut seen in collapsed Bandit runs). It reads each first turn as the rollout
saved it (its state, and the think block and actions the turn parser found: a malformed
reply has neither). The argued arm is read from the solver rationale's wording the SFT
taught ("X pays more on average than Y": Y is the worse arm); a think block without
"than <arm>" counts as arguing for none.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from starpo.runs import load_jsonl, step_files, warn_skipped

ARMS = ("Phoenix", "Dragon")


def argued_arm(think: str) -> str | None:
    """The arm a think block argues pays more: the other one than `than <arm>` names."""
    worse = re.search(r"than (Phoenix|Dragon)", think)
    if not worse:
        return None
    return ARMS[1] if worse.group(1) == ARMS[0] else ARMS[0]


def first_listed_arm(state: str) -> str | None:
    """The arm a Bandit state lists first ("Arms: Phoenix | Dragon")."""
    found = re.search(r"Arms: (\w+) \|", state)
    return found.group(1) if found else None


def agreement(trajectories: list[dict]) -> dict:
    """Counts of one validation step: replies by (argued, answered), answers that are the
    first-listed arm, and answers that contradict an argued arm."""
    pairs: Counter = Counter()
    first = contradict = 0
    for trajectory in trajectories:
        turn = trajectory["turns"][0]
        answered = turn["actions"][0] if turn["actions"] else None
        argued = argued_arm(turn["think"])
        pairs[f"{argued} -> {answered}"] += 1
        first += answered is not None and answered == first_listed_arm(turn["state"])
        contradict += argued is not None and answered is not None and argued != answered
    return {
        "episodes": len(trajectories),
        "answered_first_listed": first,
        "answer_contradicts_think": contradict,
        "argued_to_answered": dict(sorted(pairs.items())),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a think run's folder (with val_trajectories/)")
    args = parser.parse_args(argv)
    files = step_files(args.run / "val_trajectories")
    if not files:
        print(f"error: no val_trajectories/step_*.jsonl in {args.run}; pass a run folder "
              "trained with validation", file=sys.stderr)  # fmt: skip
        return 2
    for step, path in files:
        read = load_jsonl(path, skip_broken=True)
        warn_skipped(read)
        counts = agreement(read.records)
        print(
            f"step {step:>4}: {counts['episodes']} episodes, "
            f"{counts['answered_first_listed']} answered the first-listed arm, "
            f"{counts['answer_contradicts_think']} against their own reasoning; "
            f"argued -> answered {counts['argued_to_answered']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
