"""`starpo train`: a run from a YAML config (or preset) and dotted overrides, started,
resumed or started over in its folder, with the summary printed at the end."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from starpo.errors import UserError


def start_or_resume(out: Path, mode: str | None, overwrite: bool) -> tuple[bool, str | None]:
    """Whether to resume, and a line to say why, for `starpo train --out OUT`.

    `--resume`: resume (the trainer refuses when there is no checkpoint). `--resume auto`:
    resume when a checkpoint exists, else start fresh (a job scheduler's restart loop).
    Without either, a folder that holds a run is refused unless `--overwrite`, which
    removes that run's outputs first (a fresh start never mixes with an older run's files).
    """
    from starpo.runs import RunFolder
    from starpo.trainer.checkpoints.store import latest_checkpoint

    folder = RunFolder(out)
    if mode == "latest":
        return True, None
    if mode == "auto":
        found = latest_checkpoint(out)
        if found is not None:
            return True, f"--resume auto: continuing from {found}"
        said = f"--resume auto: no checkpoint in {folder.checkpoints}; starting fresh"
        if folder.holds_run():
            folder.clear()
            said += " (the unfinished run's files were removed)"
        return False, said
    earlier = folder.holds_run()
    if earlier and not overwrite:
        raise UserError(
            f"{out} already holds a run ({', '.join(earlier)}); continue it with --resume "
            "(or --resume auto), or start over with --overwrite"
        )
    if earlier:
        folder.clear()
        return False, f"--overwrite: removed the earlier run's {', '.join(earlier)} in {out}"
    return False, None


def cmd_train(args: argparse.Namespace) -> int:
    from starpo.config import load_config

    out = Path(args.out)
    mode = args.resume
    config_path = args.config  # a YAML path or a preset name (see starpo.config.presets)
    if config_path is None and mode and (out / "config.yaml").is_file():
        config_path = out / "config.yaml"  # resume with the config the run was saved with
    cfg = load_config(config_path, args.overrides)  # a bad config fails before files change
    from starpo.envs import make

    # A wrong env id or argument fails in one line here, in a second, before torch loads.
    make(cfg.env.id, **cfg.env.kwargs)
    make(cfg.env.validation_id, **cfg.env.validation_kwargs)
    if cfg.trainer.memory_check:
        from starpo.memory.fit import check_fits

        check_fits(cfg)  # before any file changes or any model loads
    resume, said = start_or_resume(out, mode, args.overwrite)
    if said:
        print(said, file=sys.stderr)
    from starpo.trainer.loop import Trainer

    trainer = Trainer(cfg, out, resume=resume, quiet=args.quiet)
    history = trainer.train()
    print(format_training_summary(cfg, history, out))
    return 0


def format_training_summary(cfg: Any, history: list[dict[str, Any]], out: Path) -> str:
    """Validation success before and after, with 95% intervals, and where things are."""
    key = f"val/{cfg.env.validation_id}"
    validated = [h for h in history if f"{key}/success" in h]
    lines = [f"run folder: {out}  (metrics.jsonl, checkpoints/, final/)"]
    for label, entry in (("first", validated[:1]), ("last", validated[-1:])):
        for h in entry:
            lines.append(
                f"validation at step {h['step']:>4} ({label}): success "
                f"{h[f'{key}/success']:.1%} (95% CI {h[f'{key}/success_ci95_low']:.1%} - "
                f"{h[f'{key}/success_ci95_high']:.1%}), format ok {h[f'{key}/format_ok']:.1%}"
            )
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    from starpo.config import format_config_help, presets

    p = sub.add_parser(
        "train",
        help="train an agent with StarPO / StarPO-S",
        description="Train with a YAML config (or a preset shipped with starpo) and dotted "
        "overrides, e.g. starpo train --config cpu-bandit-starpo-s optim.actor_lr=1e-5 "
        "--out runs/demo",
        epilog="config options (KEY=VALUE overrides):\n" + format_config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        help="YAML file, or a preset: " + ", ".join(presets()) + " (default: built-ins)",
    )
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides (anywhere)"
    )
    p.add_argument("--out", required=True, help="run folder (metrics, checkpoints, final model)")
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        choices=("latest", "auto"),
        help="continue from the latest checkpoint (an error when there is none); "
        "--resume auto: continue when one exists, else start fresh (for restart loops)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start fresh in a folder that holds a run: its metrics, trajectories, "
        "checkpoints and final model are removed first",
    )
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
    p.set_defaults(func=cmd_train)
