"""The Echo Trap side by side: vanilla StarPO (GRPO and PPO) against StarPO-S, same model,
learning rate, rollouts per step and seeds, several training seeds each, on a CPU.

    python experiments/echo_trap.py --out runs/echo-trap-bandit              # run, then sum up
    python experiments/echo_trap.py --out runs/echo-trap-bandit --steps 100  # go on further
    python experiments/echo_trap.py --out runs/echo-trap-bandit --summary-only

Every run is a `starpo train` of the Bandit demo preset (`cpu-bandit-starpo-s`: 8 groups x 8
rollouts, lr 5e-6, validation on 256 seeds every 5 steps) without its early stop, changed
only as its arm says:

- `starpo-s`: the preset: top-25% groups by reward std, no KL, clip 0.2 / 0.28, GRPO;
- `vanilla-grpo`: RAGEN's vanilla StarPO with GRPO: every group trained, KL 0.001 to the
  reference model, clip 0.2 / 0.2;
- `vanilla-ppo`: the same with PPO: a critic and GAE instead of group-normalised returns;
- `starpo-s-rollback` (only with `--arms`): StarPO-S with `trainer.on_collapse=rollback`;
- `starpo-s-no-std` (only with `--arms`): StarPO-S with advantages only centred in their
  group (`algorithm.norm_by_std=false`, Dr. GRPO's change).

Each arm makes one optimizer update per step (its mini-batch is all it trains: 16
trajectories for StarPO-S, 64 for vanilla), so the arms differ in what the paper's StarPO-S
changes, not in how many updates the learning rate is applied over. The runs go one after
another (seed by seed, so stopping early leaves every arm with as many seeds), each with
`--resume auto`: rerunning the command continues where a stopped session left off, and a
larger `--steps` extends finished runs.

Then `results.json` (a row per arm and seed: `collapse_step` by `diagnostics.outcome`'s
definition, best and final validation success, the detector's first alert, steps and
minutes; the median per arm) and `starpo report` figures per seed (validation success,
in-group reward std, entropy, gradient norm and the detector's alerts, arm against arm).
`--export DIR` copies what a results page cites into DIR (results.json, each seed's
`compare.png`, and each run's config, alerts and gzipped metrics), leaving checkpoints and
trajectories out.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from starpo.cli.args import ListFlag, all_overrides
from starpo.diagnostics.outcome import COLLAPSE_DROP, best_success, collapse_step
from starpo.runs.metrics import metric_curves, read_alerts, read_metrics
from starpo.viewer.report import main_figure_name

PRESET = "cpu-bandit-starpo-s"
VANILLA = ["filter.enabled=false", "algorithm.kl_coef=0.001", "algorithm.clip_high=0.2"]
ARMS = {
    "starpo-s": [],
    "vanilla-grpo": [*VANILLA, "optim.mini_batch_size=64"],
    "vanilla-ppo": [*VANILLA, "algorithm.adv_estimator=gae", "optim.mini_batch_size=64"],
    # StarPO-S that rolls back when the detector calls collapse (to the last checkpoint
    # saved while it said healthy, at half the learning rate): does that rescue the run?
    "starpo-s-rollback": ["trainer.on_collapse=rollback"],
    # StarPO-S whose GRPO advantages are only centred, not divided by the group's reward std
    # (Dr. GRPO): once a group's replies agree, the std division keeps its update full-size
    # however small the reward difference; is that what drives the late collapse?
    "starpo-s-no-std": ["algorithm.norm_by_std=false"],
}
PAPER_ARMS = ["starpo-s", "vanilla-grpo", "vanilla-ppo"]  # the default: RAGEN's comparison
COMMON = ["trainer.stop_at_success=null", "trainer.save_every=5", "trainer.val_every=5"]


def seed_runs(out: Path, seed: int) -> list[Path]:
    """The run folders of `seed` under `out` that logged metrics, in ARMS order."""
    folders = [run_dir(out, arm, seed) for arm in ARMS]
    return [folder for folder in folders if (folder / "metrics.jsonl").exists()]


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-seed{seed}"


def train_command(out: Path, arm: str, seed: int, steps: int, extra: list[str]) -> list[str]:
    """The `starpo train` of one run (continued when its folder holds one)."""
    folder = run_dir(out, arm, seed)
    return [
        sys.executable, "-m", "starpo", "train", "--config", PRESET, "--out", str(folder),
        "--resume", "auto", "--quiet", f"trainer.seed={seed}",
        f"trainer.total_steps={steps}", *COMMON, *ARMS[arm], *extra,
    ]  # fmt: skip


def start_run(out: Path, arm: str, seed: int, steps: int, extra: list[str]):
    """One run to `steps` (continued when its folder holds one), started as its own
    process writing its train.log; what `wait_for` needs to see it end."""
    folder = run_dir(out, arm, seed)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = train_command(out, arm, seed, steps, extra)
    print("$", " ".join(cmd[2:]), flush=True)
    log = open(folder / "train.log", "a")  # noqa: SIM115 - closed by wait_for
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    return folder.name, process, log, time.perf_counter()


def wait_for(run) -> None:
    name, process, log, started = run
    code = process.wait()
    log.close()
    print(f"  {name}: exit {code} after {time.perf_counter() - started:.0f} s", flush=True)


def summarise_run(folder: Path, env: str) -> dict:
    """A run's row: collapse step, best / final validation success, first alert, size."""
    records = read_metrics(folder, skip_broken=True)
    curves = metric_curves(records)
    steps, success = curves.get(f"val/{env}/success", ([], []))
    alerts = [a for a in read_alerts(folder, skip_broken=True) if a.get("severity") != "info"]
    called = sorted({a["step"] for a in alerts if a.get("state") == "collapse"})
    minutes = curves.get("perf/train_minutes", ([], [0.0]))[1]
    # Reasoning length at the fixed validation seeds (runs with a think block): the paper
    # describes the Echo Trap as reasoning traces that shrink or vanish.
    think = curves.get(f"val/{env}/mean_think_tokens", ([], []))[1]
    last = records[-1] if records else {}
    return {
        "collapse_step": collapse_step(steps, success),
        "best_success": best_success(success),
        "final_success": success[-1] if success else None,
        "first_alert_step": alerts[0]["step"] if alerts else None,
        "first_alert_rule": alerts[0].get("rule") if alerts else None,
        "detector_collapse_step": called[0] if called else None,
        "detector_collapse_steps": called,  # with rollback: each call rolled the run back
        "rollbacks": int(last.get("diagnostics/rollbacks") or 0),
        "final_entropy": last.get("actor/entropy"),
        "final_in_group_std": last.get("rollout/in_group_std"),
        "steps": records[-1]["step"] if records else 0,
        "train_minutes": round(minutes[-1], 2) if minutes else 0.0,
        "validation": {"steps": steps, "success": success},
        "val_think_tokens": {"first": think[0], "last": think[-1]} if any(think) else None,
    }


def summarise(out: Path, seeds: list[int]) -> dict:
    rows = {}
    for arm in ARMS:
        for seed in seeds:
            folder = run_dir(out, arm, seed)
            if (folder / "metrics.jsonl").exists():
                rows[f"{arm} seed {seed}"] = {
                    "arm": arm,
                    "seed": seed,
                    **summarise_run(folder, "bandit"),
                }
    medians = {}
    for arm in ARMS:
        mine = [r for r in rows.values() if r["arm"] == arm]
        if not mine:
            continue
        collapsed = [r["collapse_step"] for r in mine if r["collapse_step"] is not None]
        called = [r for r in mine if r["detector_collapse_step"] is not None]
        medians[arm] = {
            "runs": len(mine),
            "collapsed": len(collapsed),
            "detector_called_collapse": len(called),
            "median_collapse_step": statistics.median(collapsed) if collapsed else None,
            "median_best_success": statistics.median(r["best_success"] or 0 for r in mine),
            "median_final_success": statistics.median(r["final_success"] or 0 for r in mine),
        }
    return {
        "env": "bandit",
        "env_kwargs": {},
        "preset": PRESET,
        "arms": {arm: ARMS[arm] + COMMON for arm in ARMS},
        "collapse_definition": (
            f"validation success falls at least {COLLAPSE_DROP:.0%} points under its best so "
            "far and stays there at every later validation (starpo.diagnostics.outcome)"
        ),
        "rows": rows,
        "medians": medians,
    }


def export(out: Path, dest: Path, seeds: list[int]) -> list[Path]:
    """Copy the summary, each seed's all-panels figure (`compare.png`, arm against arm, or
    `overview.png` where a seed has one run; the single-metric ones are ~1 MB more a seed)
    and each run's config, alerts and metrics (gzipped: ~10x smaller) from `out` into
    `dest`; returns the files written."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    if (out / "results.json").exists():
        written.append(Path(shutil.copy2(out / "results.json", dest / "results.json")))
    for seed in seeds:
        folders = seed_runs(out, seed)
        figure = out / f"report-seed{seed}" / main_figure_name(len(folders))
        if figure.exists():
            (dest / figure.parent.name).mkdir(exist_ok=True)
            written.append(Path(shutil.copy2(figure, dest / figure.parent.name / figure.name)))
        for folder in folders:
            name = folder.name
            metrics = dest / f"{name}-metrics.jsonl.gz"
            # mtime=0: the same metrics give the same bytes, so a re-export changes nothing in git
            with open(folder / "metrics.jsonl", "rb") as src, open(metrics, "wb") as raw:
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                    shutil.copyfileobj(src, gz)
            written.append(metrics)
            for part in ("config.yaml", "alerts.jsonl"):
                if (folder / part).exists():
                    written.append(Path(shutil.copy2(folder / part, dest / f"{name}-{part}")))
    return written


def print_table(results: dict) -> None:
    head = (
        f"{'collapse':>10}{'best':>8}{'final':>8}{'1st alert':>11}{'detector':>10}"
        f"{'entropy':>9}{'rollbacks':>10}{'steps':>7}{'min':>7}"
    )
    print(f"\n{'run':<24}{head}")
    for name, r in results["rows"].items():
        collapse = "none" if r["collapse_step"] is None else str(r["collapse_step"])
        alert = "-" if r["first_alert_step"] is None else str(r["first_alert_step"])
        best = f"{r['best_success']:.1%}" if r["best_success"] is not None else "-"
        final = f"{r['final_success']:.1%}" if r["final_success"] is not None else "-"
        called = "-" if r["detector_collapse_step"] is None else str(r["detector_collapse_step"])
        entropy = "-" if r["final_entropy"] is None else f"{r['final_entropy']:.2f}"
        cells = f"{collapse:>10}{best:>8}{final:>8}{alert:>11}{called:>10}{entropy:>9}"
        tail = f"{r.get('rollbacks', 0):>10}{r['steps']:>7}{r['train_minutes']:>7.1f}"
        if think := r.get("val_think_tokens"):
            tail += f"  think tokens {think['first']:.1f} -> {think['last']:.1f}"
        print(f"{name:<24}{cells}{tail}")
    for arm, m in results["medians"].items():
        print(
            f"{arm}: {m['collapsed']}/{m['runs']} lost 20+ points of their best (median step "
            f"{m['median_collapse_step']}), {m['detector_called_collapse']}/{m['runs']} "
            f"called collapse by the detector; median best {m['median_best_success']:.1%}, "
            f"final {m['median_final_success']:.1%}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/echo-trap-bandit"))
    parser.add_argument("--steps", type=int, default=60, help="training steps of every run")
    parser.add_argument("--seeds", action=ListFlag, kind=int, default=[1, 2, 3])
    parser.add_argument("--arms", action=ListFlag, allowed=list(ARMS), default=PAPER_ARMS)
    parser.add_argument("--summary-only", action="store_true", help="only sum up the runs")
    parser.add_argument(
        "--parallel", action="store_true", help="start every run at once (a GPU holds them all)"
    )
    parser.add_argument(
        "--export", type=Path, metavar="DIR",
        help="then copy results.json, figures and each run's config, alerts and metrics here",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    args = parser.parse_args(argv)
    args.overrides = all_overrides(args)
    runs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    if args.parallel and not args.summary_only:  # one GPU holds them all
        started = [start_run(args.out, arm, seed, args.steps, args.overrides) for arm, seed in runs]
        for run in started:
            wait_for(run)
    elif not args.summary_only:
        for arm, seed in runs:
            wait_for(start_run(args.out, arm, seed, args.steps, args.overrides))
    results = summarise(args.out, args.seeds)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    for seed in args.seeds:
        folders = [str(folder) for folder in seed_runs(args.out, seed)]
        if folders:
            report = [sys.executable, "-m", "starpo", "report", *folders]
            subprocess.run([*report, "--out", str(args.out / f"report-seed{seed}")], check=False)
    if args.export:
        written = export(args.out, args.export, args.seeds)
        print(f"exported {len(written)} files to {args.export}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
