"""The multi-turn recipe on a laptop CPU: base model, SFT on solver play, then StarPO-S.

    python -m starpo.demo --env sokoban      # or frozenlake
    python -m starpo.demo --env sokoban --out runs/recipe-sokoban   # resumes a stopped run

Stages, each in a folder of its own under `--out` (a stage whose result is already there is
not run again, so a stopped recipe resumes where it was):

1. `base/`: the base model on the validation seeds.
2. `sft/`: `starpo sft` on solver episodes from training seeds (never the validation
   seeds), laid out exactly as the RL run's rollouts (the preset's rollout section).
3. `sft-eval/`: the SFT model on the validation seeds.
4. `rl/`: `starpo train` with the env's CPU preset from the SFT model (StarPO-S).
5. `rl-eval/`: the trained policy on the validation seeds.
6. `base-think/`: the base model with a think block, on the first 64 seeds under a short
   budget (it never closes its think block: 400 tokens a turn would cost an hour).

Every evaluation uses the same seeds and settings (the preset's rollout section at its
validation temperature), so the rows compare; `results.json` holds the table, with 95%
Wilson intervals and the minutes each stage took.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from starpo.errors import UserError

RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Recipe:
    """One env's recipe: the RL preset and the size of the SFT stage (see the presets'
    comments for why these values)."""

    env: str
    preset: str  # shipped config of the RL stage; its rollout section shapes SFT and evals
    sft_episodes: int  # solver episodes from training seeds
    sft_epochs: int
    sft_lr: float
    eval_seeds: int = 256  # validation seeds of every row (the 256)
    base_think_tokens: int = 128  # the base model's think-variant budget per turn ...
    base_think_seeds: int = 64  # ... and seeds: it writes ~10x the tokens of the others


# SFT lr 2e-4 for 3 epochs (46-69 AdamW steps of 8 dialogues, cosine): on Sokoban's 200
# solver dialogues the validation turn accuracy (replies exactly the solver's) reached
# 25.2%, 53.0%, 63.5% after epochs 1-3 and was still rising; at 2e-5 it stalled at 38.3%
# after 2 epochs and the model played at the random policy's level (11.3% success).
RECIPES: dict[str, Recipe] = {
    "sokoban": Recipe("sokoban", "cpu-sokoban-sft-starpo-s", 200, 3, 2e-4),
    "frozenlake": Recipe("frozenlake", "cpu-frozenlake-sft-starpo-s", 200, 3, 2e-4),
}


def recipe_for(env_id: str) -> Recipe:
    if env_id not in RECIPES:
        raise UserError(
            f"no multi-turn recipe for env {env_id!r}; choose one of: {', '.join(RECIPES)} "
            "(or run `starpo sft` and `starpo train` yourself)"
        )
    return RECIPES[env_id]


# ---------------------------------------------------------------------------- stages
def run_stage(folder: Path, name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`work()` once: its result is kept in `folder/stage.json` with its minutes, and a
    later call returns the kept result (resume) instead of running it again."""
    record = folder / "stage.json"
    if record.exists():
        try:
            kept = json.loads(record.read_text(encoding="utf-8"))
            print(f"[{name}] done before ({kept['minutes']:.1f} min): {record}", flush=True)
            return kept
        except (json.JSONDecodeError, KeyError):
            print(f"[{name}] {record} is unreadable: running the stage again", flush=True)
    print(f"[{name}] ...", flush=True)
    started = time.perf_counter()
    result = work()
    kept = {"stage": name, "minutes": (time.perf_counter() - started) / 60, **result}
    folder.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")
    print(f"[{name}] {kept['minutes']:.1f} min", flush=True)
    return kept


def evaluate(model: str, cfg: Any, folder: Path, settings: Any, seeds: int) -> dict[str, Any]:
    """`model` on `seeds` validation seeds from the preset's first one; writes `starpo
    eval`'s files in `folder`."""
    from starpo.evaluation import write_results
    from starpo.rollout.evaluate import evaluate_model, progress_bar

    first = cfg.trainer.val_seed_start
    bar, show = progress_bar(seeds, f"eval {Path(model).name}")
    with bar:
        result, summary = evaluate_model(
            cfg.env.id,
            model,
            list(range(first, first + seeds)),
            settings,
            device=cfg.model.device,
            backend=cfg.rollout.backend,
            dtype=cfg.rollout.dtype,
            seed=first,
            env_kwargs=dict(cfg.env.kwargs),
            on_turn=show,
        )
    write_results(folder, result.trajectories, summary)
    keys = ("success", "success_ci95_low", "success_ci95_high", "format_ok", "num_episodes")
    return {"model": model, **{k: summary[k] for k in keys}}


def run_recipe(
    env_id: str,
    out: Path,
    *,
    quick: bool = False,
    overrides: Sequence[str] = (),
    eval_seeds: int | None = None,
) -> dict[str, Any]:
    """All stages for `env_id` under `out`; returns (and writes) the results table.
    `quick`: a few seeds, steps and episodes, to try the whole path in minutes;
    `overrides`: dotted config overrides of the RL preset (its model.name is the base);
    `eval_seeds`: validation seeds of each row (default the recipe's 256)."""
    from starpo.config import load_config
    from starpo.sft import run_sft
    from starpo.sft.train import TrainOptions
    from starpo.trainer import Trainer

    recipe = recipe_for(env_id)
    if quick:  # before the caller's overrides, which win
        small = ["trainer.val_seeds=8", "trainer.total_steps=2", "trainer.val_every=0"]
        overrides = [*small, *overrides]
        recipe = replace(recipe, sft_episodes=16, sft_epochs=1, eval_seeds=8)
    if eval_seeds is not None:
        if eval_seeds < 1:
            raise UserError(f"eval_seeds must be at least 1, got {eval_seeds}")
        recipe = replace(recipe, eval_seeds=eval_seeds)
    cfg = load_config(recipe.preset, overrides)
    settings = cfg.rollout.settings(temperature=cfg.trainer.val_temperature)
    think_settings = replace(settings, think=True, max_new_tokens=recipe.base_think_tokens)
    base = cfg.model.name

    def evaluation(
        name: str, folder: str, model: str, how: Any = settings, seeds: int = recipe.eval_seeds
    ) -> dict[str, Any]:
        where = out / folder
        return run_stage(where, name, lambda: evaluate(model, cfg, where, how, seeds))

    rows = {"base": evaluation("base", "base", base)}
    sft_dir = out / "sft"

    def sft() -> dict[str, Any]:
        import torch

        from starpo.models.loading import resolve_dtype

        # SFT computes in the RL stage's dtype (bf16 autocast in the CPU presets).
        mixed = resolve_dtype(cfg.model.dtype, torch.device(cfg.model.device)) == torch.bfloat16
        options = TrainOptions(
            epochs=recipe.sft_epochs, lr=recipe.sft_lr, dtype="bf16" if mixed else "fp32"
        )
        summary = run_sft(
            base,
            (),
            cfg.rollout.settings(),
            sft_dir,
            options=options,
            from_solver=recipe.sft_episodes,
            env_id=cfg.env.id,
            env_kwargs=dict(cfg.env.kwargs),
            device=cfg.model.device,
        )
        return {"epochs": summary["epochs"], "data": summary["data"]}

    run_stage(sft_dir, "sft", sft)
    rows["SFT"] = evaluation("SFT eval", "sft-eval", str(sft_dir))
    rl_dir = out / "rl"

    def rl() -> dict[str, Any]:
        from starpo.trainer.checkpoint import latest_checkpoint

        rl_cfg = load_config(recipe.preset, [*overrides, f"model.name={sft_dir}"])
        resume = latest_checkpoint(rl_dir) is not None  # a stopped recipe continues its run
        history = Trainer(rl_cfg, rl_dir, resume=resume).train()
        return {"steps": len(history)}

    run_stage(rl_dir / "recipe", "StarPO-S", rl)
    rows["SFT + StarPO-S"] = evaluation("StarPO-S eval", "rl-eval", str(rl_dir / "final"))
    # Last: the least telling row (the base model never closes its think block), and the
    # costliest per episode.
    rows["base, think"] = evaluation(
        "base, think",
        "base-think",
        base,
        think_settings,
        min(recipe.base_think_seeds, recipe.eval_seeds),
    )
    results = {
        "env": env_id,
        "preset": recipe.preset,
        "val_seed_start": cfg.trainer.val_seed_start,
        "rows": rows,
        "minutes": _minutes(out),
    }
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(format_results(results))
    return results


def _minutes(out: Path) -> dict[str, float]:
    """Minutes of every finished stage, by stage name."""
    minutes = {}
    for record in sorted(out.glob("**/stage.json")):
        kept = json.loads(record.read_text(encoding="utf-8"))
        minutes[kept["stage"]] = kept["minutes"]
    return minutes


def format_results(results: dict[str, Any]) -> str:
    """The recipe's table: success with 95% intervals per row, RL's own contribution, and
    where the time went."""
    rows = results["rows"]
    lines = [
        f"{results['env']}: validation seeds from {results['val_seed_start']}, "
        f"preset {results['preset']}",
        f"{'policy':<16}{'episodes':>9}{'success':>9}  {'95% CI':<17}{'format ok':>10}",
    ]
    for name, row in rows.items():
        interval = f"{row['success_ci95_low']:.1%} - {row['success_ci95_high']:.1%}"
        lines.append(
            f"{name:<16}{row['num_episodes']:>9}{row['success']:>9.1%}  {interval:<17}"
            f"{row['format_ok']:>10.1%}"
        )
    sft, rl = rows.get("SFT"), rows.get("SFT + StarPO-S")
    if sft and rl:
        gain = rl["success"] - sft["success"]
        beyond = rl["success_ci95_low"] > sft["success_ci95_high"]
        lines.append(
            f"StarPO-S's own contribution: {gain:+.1%} "
            f"({'beyond' if beyond else 'not beyond'} both 95% intervals)"
        )
    spent = results["minutes"]
    lines.append(
        "minutes: "
        + ", ".join(f"{name} {m:.1f}" for name, m in spent.items())
        + f"; total {sum(spent.values()):.1f}"
    )
    return "\n".join(lines)
