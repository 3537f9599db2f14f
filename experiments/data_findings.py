"""The paper's data findings side by side at an equal budget: interaction granularity
(actions a turn), rollout freshness (policy updates per rollout batch) and task diversity
(env groups x rollouts per group at a fixed number of episodes a step).

    python experiments/data_findings.py --out runs/findings-fl --steps 30 model.device=cuda
    python experiments/data_findings.py --out runs/findings-fl --minutes 20   # a CPU, slow
    python experiments/data_findings.py --out runs/findings-fl --steps 36 --arms k1,k5 \\
        trainer.num_threads=2                                   # some arms, on a CPU
    python experiments/data_findings.py --out runs/findings-fl --summary-only \\
        --export docs/results/findings-fl

Every arm is one `starpo demo --env frozenlake --no-base --methods grpo` on non-slippery
FrozenLake, the setting where RL from the solver-SFT model learned (one GPU, 15 steps: 34%
-> 68%, docs/results/index.md): SFT on the solver's episodes, then GRPO with every group
trained (no filter), mini-batches of 16, actor lr 2e-5 and the per-trajectory loss, each
row on the same 256 validation seeds with 95% Wilson intervals. The arms differ from the
shared one (`k1`: one action a turn in up to 10 turns, 8 groups x 8 rollouts, one update
per rollout batch) only in what their name says:

- granularity: `k3` (up to 3 actions a turn, 4 turns) and `k5` (5 a turn, 2 turns); each
  from an SFT model of its own layout (the solver plays as many moves a turn); still at
  most 10 moves an episode;
- freshness: `reuse4` (`optim.ppo_epochs=4`: each rollout batch trained 4 times over, so
  the later updates learn from older rollouts);
- diversity: `16x4` and `4x16` (groups x group size; 64 episodes a step like 8 x 8).

Arms of one layout share its SFT model and the start's evaluation (symlinks to the first
arm's folders), so their rows differ only by RL. The budget is the same for every arm:
`--steps` (rollout batches: the same episodes played) or `--minutes` (the RL stage's
training minutes: the same compute; reuse4's steps then cost more). Arms run one after
another (`--parallel N` starts N at once: one GPU holds several 135M models); rerunning
the command continues each arm where it stopped (the recipe's stages resume).

Then `results.json`: a table per finding (its arms' start and RL rows with intervals, steps
and minutes) and whether it shows the paper's direction (REFERENCE: 5-6 actions a turn
best of 1-7; one update per rollout batch best; for diversity no direction is stated).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from starpo.cli.args import ListFlag, all_overrides

COMMON = [  # RL from the solver-SFT model where it learned (docs/results/index.md)
    "env.kwargs={is_slippery: false}",
    "filter.enabled=false",
    "optim.mini_batch_size=16",
    "optim.actor_lr=2e-5",
    "algorithm.loss_agg=seq_mean_token_mean",
    "trainer.val_every=10",
    "trainer.save_every=5",
]
ARMS: dict[str, list[str]] = {
    "k1": [],  # the shared arm: the preset's layout, 8 x 8, one update per rollout batch
    "k3": ["rollout.max_actions_per_turn=3", "rollout.max_turns=4"],
    "k5": ["rollout.max_actions_per_turn=5", "rollout.max_turns=2"],
    "reuse4": ["optim.ppo_epochs=4"],
    "16x4": ["rollout.num_groups=16", "rollout.group_size=4"],
    "4x16": ["rollout.num_groups=4", "rollout.group_size=16"],
}
# Each finding: its arms in the order of the knob, and the arm the paper found best
# (None: no direction stated in the reference).
FINDINGS: dict[str, tuple[list[str], str | None]] = {
    "granularity": (["k1", "k3", "k5"], "k5"),
    "freshness": (["k1", "reuse4"], "k1"),
    "diversity": (["16x4", "k1", "4x16"], None),
}
METHOD = "grpo"  # every arm's RL method: its recipe folder is rl-grpo, its run "grpo"
LAYOUT_KEYS = ("rollout.max_actions_per_turn", "rollout.max_turns")
SHARED_STAGES = ("sft", "sft-eval")  # what arms of one layout share


def layout(arm: str) -> tuple[str, ...]:
    """The overrides that shape an arm's SFT examples (arms with equal layouts share SFT)."""
    return tuple(o for o in ARMS[arm] if o.split("=")[0] in LAYOUT_KEYS)


def layout_maker(arm: str, arms: list[str]) -> str:
    """The arm whose SFT model `arm` trains from: the first of its layout in `arms`."""
    return next(first for first in arms if layout(first) == layout(arm))


def share_start(out: Path, arm: str, arms: list[str]) -> None:
    """Link `arm`'s SFT stages to those of its layout's maker, so its RL starts from the
    same model and its start row is the same evaluation (the maker makes its own)."""
    maker = layout_maker(arm, arms)
    if maker == arm:
        return
    for stage in SHARED_STAGES:
        link = out / arm / stage
        if not link.exists() and not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path("..") / maker / stage, target_is_directory=True)


def demo_command(out: Path, arm: str, flags: list[str], extra: list[str]) -> list[str]:
    """The `starpo demo` of one arm (resumed when its folder holds stages): `flags` are
    the recipe's (the budget, seeds), `extra` dotted overrides."""
    return [
        sys.executable, "-m", "starpo", "demo", "--env", "frozenlake", "--no-base",
        "--methods", METHOD, "--out", str(out / arm), *flags, *COMMON, *ARMS[arm], *extra,
    ]  # fmt: skip


def layout_makers(arms: list[str]) -> list[str]:
    """The arms that make their layout's SFT model, in `arms` order."""
    return [arm for arm in arms if layout_maker(arm, arms) == arm]


def run_arms(out: Path, arms: list[str], flags: list[str], extra: list[str], parallel: int):
    """Every arm's recipe, `parallel` at a time, each writing its log beside its stages.
    The arms that make an SFT model run first; the arms sharing it start once it exists."""
    makers = layout_makers(arms)
    for batch_of in (makers, [arm for arm in arms if arm not in makers]):
        for first in range(0, len(batch_of), parallel):
            running = []
            for arm in batch_of[first : first + parallel]:
                share_start(out, arm, arms)
                (out / arm).mkdir(parents=True, exist_ok=True)
                cmd = demo_command(out, arm, flags, extra)
                print("$", " ".join(cmd[2:]), flush=True)
                log = open(out / arm / "demo.log", "a")  # noqa: SIM115 - closed below
                running.append((arm, subprocess.Popen(cmd, stdout=log, stderr=log), log))
            for arm, process, log in running:
                code = process.wait()
                log.close()
                print(f"  {arm}: exit {code}", flush=True)


def arm_rows(out: Path, arm: str) -> dict | None:
    """An arm's start and RL rows from its recipe's results.json (None: not finished)."""
    try:
        results = json.loads((out / arm / "results.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    rl = next(row for name, row in results["rows"].items() if name.startswith("SFT + "))
    run = results["rl_runs"].get(METHOD, {})
    return {
        "overrides": ARMS[arm],
        "start": results["rows"]["SFT"],
        "rl": {**rl, "steps": run.get("steps"), "train_minutes": run.get("train_minutes")},
    }


def verdict(rows: dict[str, dict], best: str | None) -> str:
    """Whether the arms show the paper's direction: its best arm's RL interval above every
    other arm's ("confirmed"), below one of them ("contradicted"), else "not separated"."""
    if best is None or best not in rows:
        return "no direction stated" if best is None else "its best arm did not finish"
    ours = rows[best]["rl"]
    others = [row["rl"] for arm, row in rows.items() if arm != best]
    if not others:
        return "no other arm finished"
    if all(ours["success_ci95_low"] > o["success_ci95_high"] for o in others):
        return "confirmed"
    if any(ours["success_ci95_high"] < o["success_ci95_low"] for o in others):
        return "contradicted"
    return "not separated by the intervals"


def summarise(out: Path) -> dict:
    """The findings' tables from the arms' folders, as results.json keeps them."""
    done = {arm: rows for arm in ARMS if (rows := arm_rows(out, arm)) is not None}
    findings = {}
    for name, (arms, best) in FINDINGS.items():
        rows = {arm: done[arm] for arm in arms if arm in done}
        findings[name] = {"arms": arms, "paper_best": best, "rows": rows,
                          "verdict": verdict(rows, best)}  # fmt: skip
    return {"env": "frozenlake", "env_kwargs": {"is_slippery": False},
            "common_overrides": COMMON, "findings": findings}  # fmt: skip


def format_findings(results: dict) -> str:
    lines = []
    for name, finding in results["findings"].items():
        lines.append(f"{name} (paper's best: {finding['paper_best'] or '-'}): {finding['verdict']}")
        for arm in finding["arms"]:
            row = finding["rows"].get(arm)
            if row is None:
                lines.append(f"  {arm:7s} not finished")
                continue
            start, rl = row["start"], row["rl"]
            lines.append(
                f"  {arm:7s} start {start['success']:6.1%}  RL {rl['success']:6.1%} "
                f"({rl['success_ci95_low']:.1%} - {rl['success_ci95_high']:.1%}, "
                f"{rl['num_episodes']} seeds)  {rl['steps']} steps, "
                f"{rl['train_minutes'] or 0:.1f} min"
            )
    return "\n".join(lines)


def export(out: Path, dest: Path, arms: list[str]) -> None:
    """What a results page cites: results.json and the RL metrics and config of `arms`."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "results.json", dest / "results.json")
    for arm in arms:
        for name in ("metrics.jsonl", "config.yaml", "alerts.jsonl"):
            source = out / arm / f"rl-{METHOD}" / name
            if source.exists():
                (dest / arm).mkdir(exist_ok=True)
                shutil.copy(source, dest / arm / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/findings-frozenlake"))
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, default=30, help="RL steps of every arm")
    budget.add_argument("--minutes", type=float, help="RL training minutes of every arm")
    parser.add_argument(
        "--arms", action=ListFlag, allowed=list(ARMS), default=list(ARMS), metavar="ARM",
        help=f"arms to run, space- or comma-separated (default all: {' '.join(ARMS)})",
    )  # fmt: skip
    parser.add_argument("--parallel", type=int, default=1, help="arms run at once")
    parser.add_argument("--eval-seeds", type=int, help="validation seeds of each row (256)")
    parser.add_argument("--quick", action="store_true", help="the recipe's try-the-path sizes")
    parser.add_argument("--summary-only", action="store_true", help="only sum up the folders")
    parser.add_argument(
        "--export", type=Path, help="copy results.json and the metrics of the --arms here"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every arm")
    args = parser.parse_args(argv)

    if not args.summary_only:
        started = time.perf_counter()
        if args.minutes is not None:
            recipe_flags = ["--rl-minutes", f"{args.minutes:g}"]
        else:
            recipe_flags = ["--steps", str(args.steps)]
        if args.eval_seeds is not None:
            recipe_flags += ["--eval-seeds", str(args.eval_seeds)]
        if args.quick:
            recipe_flags.append("--quick")
        overrides = all_overrides(args)
        run_arms(args.out, args.arms, recipe_flags, overrides, max(1, args.parallel))
        print(f"arms done in {(time.perf_counter() - started) / 60:.1f} min", flush=True)
    results = summarise(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(format_findings(results))
    if args.export:
        export(args.out, args.export, args.arms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
