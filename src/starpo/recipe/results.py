"""The multi-turn recipe's results (`starpo.recipe.stages`): row labels with the settings each row
was made with, the minutes of every stage, and the table the recipe prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starpo.recipe.methods import Recipe


def _number(value: float) -> str:
    """2e-4 as "2e-4", 1.5e-5 as "1.5e-5": an lr as people write it."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def sft_label(recipe: Recipe) -> str:
    """E.g. "SFT (400 solver episodes, 5 epochs, lr 2e-4)", for a format-only warm start
    "SFT (256 random-policy episodes: format only, 2 epochs, lr 2e-4)", for a weak one
    "SFT (256 weak-policy episodes: 50% solver moves, 2 epochs, lr 2e-4)", for a world
    model "SFT (256 random-policy episodes: world model, 2 epochs, lr 2e-4)"."""
    epochs = f"{recipe.sft_epochs} epoch{'s' * (recipe.sft_epochs != 1)}"
    played = "solver episodes"
    if recipe.sft_from == "random":
        played = "random-policy episodes: format only"
    elif recipe.sft_from == "weak":
        played = f"weak-policy episodes: {recipe.weak_skill:.0%} solver moves"
    elif recipe.sft_from == "world-model":
        played = "random-policy episodes: world model"
    return f"SFT ({recipe.sft_episodes} {played}, {epochs}, lr {_number(recipe.sft_lr)})"


def rft_label(recipe: Recipe, rounds: list[dict[str, Any]]) -> str:
    """E.g. "SFT + RFT (1 round of 128 seeds x 8 samples: 97 of 1024 kept, 1 epoch, lr
    1e-4)": the rounds' sampling, what they kept in all, and their training."""
    count = len(rounds)
    sampled = sum(r.get("sampled", 0) for r in rounds)
    kept = sum(r.get("kept", 0) for r in rounds)
    epochs = f"{recipe.rft_epochs} epoch{'s' * (recipe.rft_epochs != 1)}"
    return (
        f"SFT + RFT ({count} round{'s' * (count != 1)} of {recipe.rft_seeds} seeds x "
        f"{recipe.rft_samples} samples: {kept} of {sampled} kept, {epochs}, "
        f"lr {_number(recipe.rft_lr)})"
    )


def rl_label(label: str, rl: dict[str, Any], budget: float | None) -> str:
    """E.g. "SFT + GiGPO (37 steps, 30.2 of 30 min)": the steps it ran and its training
    minutes (of the --rl-minutes budget); a record from before those were kept: none."""
    steps, minutes = rl.get("steps"), rl.get("train_minutes")
    if steps is None or minutes is None:
        return f"SFT + {label}"
    spent = f"{minutes:.1f} of {budget:g} min" if budget else f"{minutes:.1f} min"
    return f"SFT + {label} ({steps} step{'s' * (steps != 1)}, {spent})"


def heldout_label(kwargs: tuple[tuple[str, Any], ...]) -> str:
    """E.g. "held-out cases (split=heldout)"."""
    return "held-out cases (" + ", ".join(f"{k}={v}" for k, v in kwargs) + ")"


def stage_minutes(out: Path) -> dict[str, float]:
    """Minutes of every finished stage, by stage name."""
    minutes = {}
    for record in sorted(out.glob("**/stage.json")):
        kept = json.loads(record.read_text(encoding="utf-8"))
        minutes[kept["stage"]] = kept["minutes"]
    return minutes


def _against(row: dict[str, Any], base: dict[str, Any]) -> str:
    """Where `row`'s 95% interval lies against `base`'s: above, below, or overlapping."""
    if row["success_ci95_low"] > base["success_ci95_high"]:
        return "above both 95% intervals"
    if row["success_ci95_high"] < base["success_ci95_low"]:
        return "below both 95% intervals"
    return "the 95% intervals overlap"


def format_results(results: dict[str, Any]) -> str:
    """The recipe's table: success with 95% intervals per row, RL's own contribution, and
    where the time went."""
    rows = results["rows"]
    labels = {name: row.get("label", name) for name, row in rows.items()}
    width = max(16, *(len(label) + 2 for label in labels.values()))
    # envs that judge moves (TextEnv.good_actions): the share of moves an optimal policy makes
    judged = any("optimal_action_rate" in row for row in rows.values())
    lines = [
        f"{results['env']}: validation seeds from {results['val_seed_start']}, "
        f"preset {results['preset']}"
        + (f"; {results['machine']}, {results['date']}" if "machine" in results else ""),
        f"{'policy':<{width}}{'episodes':>9}{'success':>9}  {'95% CI':<17}{'format ok':>10}"
        + (f"{'optimal moves':>15}" if judged else ""),
    ]
    for name, row in rows.items():
        interval = f"{row['success_ci95_low']:.1%} - {row['success_ci95_high']:.1%}"
        optimal = row.get("optimal_action_rate")
        lines.append(
            f"{labels[name]:<{width}}{row['num_episodes']:>9}{row['success']:>9.1%}  "
            f"{interval:<17}{row['format_ok']:>10.1%}"
            + ((f"{optimal:>15.1%}" if optimal is not None else f"{'-':>15}") if judged else "")
        )
    held = " (held-out)"
    for name, rl in rows.items():
        if not name.startswith("SFT + "):
            continue
        # "SFT + GRPO" against "SFT", "SFT + GRPO (held-out)" against "SFT (held-out)";
        # "SFT + RFT" against "SFT", and "SFT + RFT + GRPO" against the "SFT + RFT" it
        # started from.
        method, cases, start = name[len("SFT + ") :], "", "SFT"
        if method.endswith(held):
            method, cases = method[: -len(held)], held
        if method.startswith("RFT + "):
            method, start = method[len("RFT + ") :], "SFT + RFT"
        sft = rows.get(f"{start}{cases}")
        if sft is None:
            continue
        gain = rl["success"] - sft["success"]
        on = ", held-out cases" if cases else ""
        lines.append(f"{method}'s own contribution{on}: {gain:+.1%} ({_against(rl, sft)})")
    spent = results["minutes"]
    lines.append(
        "minutes: "
        + ", ".join(f"{name} {m:.1f}" for name, m in spent.items())
        + f"; total {sum(spent.values()):.1f}"
    )
    return "\n".join(lines)
