"""The paper's findings at small scale: vanilla StarPO against StarPO-S (the echo trap),
interaction granularity (actions per turn) and rollout freshness (policy updates per rollout
batch), from one SFT model on one env.

    python experiments/paper_findings.py --env sokoban --device cuda --out runs/findings
    python experiments/paper_findings.py --env sokoban --device cpu --steps 20 ...  # slow

1. SFT: the recipe's SFT stage (`starpo sft --from-solver`, the env's CPU preset's rollout
   layout), once per granularity (an SFT model for one action a turn and one for several).
2. The variants, all at once as separate `starpo train` processes (one GPU runs several
   135M models side by side; a CPU should run fewer steps), the same steps, seeds and
   learning rate for all; they differ only in what the name says:
   - `starpo-s`: the env's preset (top-25% std filter, GRPO, no KL, clip 0.2 / 0.28);
   - `vanilla`: RAGEN's vanilla StarPO (no filter, PPO with a critic, KL 0.001, clip 0.2 / 0.2);
   - `starpo-s-k3`: StarPO-S with up to 3 actions a turn (and 4 turns), from the SFT model
     of that layout: coarser interaction granularity than the preset's one action a turn;
   - `starpo-s-reuse4`: StarPO-S with 4 policy updates per rollout batch
     (`optim.ppo_epochs=4`): staler rollouts than the preset's fully on-policy one update.
     The same rollouts per step, so 4x the updates; the reference's freshness knob.
3. `starpo report` over all runs: the PNG curves (success, reward std, entropy, grad norm)
   and the collapse detector's alerts, side by side.

Section 3's data findings with 256-seed intervals (granularity k1 / k3 / k5, freshness,
task diversity) on non-slippery FrozenLake are `experiments/data_findings.py`.

A variant still running at `--deadline` seconds is stopped; its metrics up to then stay
(each step is written as it ends), so the report compares what every run reached.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from starpo.cli.args import ListFlag, all_overrides
from starpo.recipe.methods import RECIPES, recipe_for

VANILLA = [  # RAGEN's vanilla StarPO, as in the paper presets (paper-base.yaml)
    "filter.enabled=false",
    "algorithm.adv_estimator=gae",
    "algorithm.kl_coef=0.001",
    "algorithm.clip_low=0.2",
    "algorithm.clip_high=0.2",
]
COARSE = ["rollout.max_actions_per_turn=3", "rollout.max_turns=4"]  # still 10 per episode
STALE = ["optim.ppo_epochs=4"]  # each rollout batch trains 4 updates: older rollouts


def variants(sft_k1: Path, sft_k3: Path) -> dict[str, tuple[Path, list[str]]]:
    """Run name -> (starting model, overrides of the env's preset)."""
    return {
        "starpo-s": (sft_k1, []),
        "vanilla": (sft_k1, VANILLA),
        "starpo-s-k3": (sft_k3, COARSE),
        "starpo-s-reuse4": (sft_k1, STALE),
    }


def starpo(*args: str) -> list[str]:
    return [sys.executable, "-m", "starpo", *args]


def run_sft(args: argparse.Namespace, out: Path, layout: list[str]) -> Path:
    """The recipe's SFT stage for this rollout layout (skipped when `out` has a model)."""
    if (out / "config.json").exists():
        return out
    flags = []
    for override in layout:  # rollout.max_turns=4 -> --max-turns 4
        key, value = override.split("=")
        flags += [f"--{key.split('.')[-1].replace('_', '-')}", value]
        if key == "rollout.max_actions_per_turn":  # the solver then plays that many a turn
            flags += ["--actions-per-turn", value]
    recipe = recipe_for(args.env)  # the recipe's SFT stage, as `starpo demo --env`
    cmd = starpo(
        "sft",
        "--config",
        recipe.preset,
        "--from-solver",
        str(args.sft_episodes or recipe.sft_episodes),
        "--epochs",
        str(recipe.sft_epochs),
        "--lr",
        str(recipe.sft_lr),
        "--device",
        args.device,
        "--dtype",
        "auto",  # bf16 on a GPU and on a CPU with native bf16; fp32 elsewhere (75x faster there)
        "--quiet",
        "--out",
        str(out),
        *flags,
    )
    if args.base:
        cmd += ["--model", args.base]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="sokoban", choices=sorted(RECIPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("runs/findings"))
    parser.add_argument("--steps", type=int, default=100, help="training steps of each run")
    parser.add_argument("--lr", type=float, default=5e-6, help="actor lr of every variant")
    parser.add_argument("--deadline", type=float, default=1e9, help="seconds for the RL runs")
    parser.add_argument("--sft-episodes", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--base", default=None, help="base model (default: the preset's)")
    names = list(variants(Path(), Path()))
    parser.add_argument("--only", action=ListFlag, allowed=names, help="run only these variants")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every variant")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    sft_k1 = run_sft(args, args.out / "sft-k1", [])
    wanted = args.only or names
    # Only the coarse variant needs the second SFT model (its layout differs).
    sft_k3 = run_sft(args, args.out / "sft-k3", COARSE) if "starpo-s-k3" in wanted else sft_k1
    print(f"SFT done in {time.perf_counter() - started:.0f} s", flush=True)

    common = [
        f"model.device={args.device}",
        f"trainer.total_steps={args.steps}",
        f"optim.actor_lr={args.lr}",
        "trainer.save_every=0",
        "trainer.val_every=10",
        *all_overrides(args),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    running = {}
    for name, (model, overrides) in variants(sft_k1, sft_k3).items():
        if name not in wanted:
            continue
        run_dir = args.out / name
        cmd = starpo(
            "train", "--config", recipe_for(args.env).preset, "--out", str(run_dir), "--quiet",
            "--resume", "auto",  # a rerun continues (or finishes) each variant's run
            f"model.name={model}", *overrides, *common,
        )  # fmt: skip
        print("$", " ".join(cmd[2:]), flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        log = open(run_dir / "train.log", "w")  # noqa: SIM115 - closed when the run ends
        running[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)

    rl_started = time.perf_counter()
    while running and time.perf_counter() - rl_started < args.deadline:
        for name, (process, log) in list(running.items()):
            if process.poll() is not None:
                log.close()
                print(f"{name}: exit {process.returncode} after "
                      f"{time.perf_counter() - rl_started:.0f} s", flush=True)  # fmt: skip
                del running[name]
        time.sleep(2)
    for name, (process, log) in running.items():
        process.terminate()
        process.wait(timeout=60)
        log.close()
        print(f"{name}: stopped at the deadline ({args.deadline:.0f} s)", flush=True)

    runs = [str(args.out / name) for name in wanted
            if (args.out / name / "metrics.jsonl").exists()]  # fmt: skip
    subprocess.run(starpo("report", *runs, "--out", str(args.out / "report")), check=False)
    print(f"total {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
