"""The recipe's rejection-sampling fine-tuning stage (`--rft-rounds R`): its flags and their
checks, the settings its rounds record, the training seeds each round samples on, and the
round itself (`starpo.sft.rejection.rft_round`), between SFT and RL."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from starpo.errors import UserError
from starpo.recipe.methods import Recipe, RecipeChoices

#: The RFT settings by the names stages record them under, with their flags.
RFT_FLAGS = {
    "rft_rounds": "--rft-rounds",
    "rft_seeds": "--rft-seeds",
    "rft_samples": "--rft-samples",
    "rft_epochs": "--rft-epochs",
    "rft_lr": "--rft-lr",
}
#: The RFT settings that mean nothing without --rft-rounds.
RFT_KNOBS = ("rft_seeds", "rft_samples", "rft_epochs", "rft_lr")


def check_rft(choices: RecipeChoices) -> None:
    """One-line UserErrors for the RFT flags: rounds 0 or more, a finite positive rate, and
    no RFT setting without rounds to apply it to (the counts are checked with the other
    counts, `stages.configure`)."""
    rounds = choices.rft_rounds
    if rounds is not None and (isinstance(rounds, bool) or rounds < 0):
        raise UserError(f"--rft-rounds must be at least 0 (0: no RFT stage), got {rounds}")
    lr = choices.rft_lr
    if lr is not None and not (math.isfinite(lr) and lr > 0):
        raise UserError(f"--rft-lr must be a learning rate above 0, got {lr:g}")
    stray = [name for name in RFT_KNOBS if getattr(choices, name) is not None]
    if stray and not rounds:
        raise UserError(f"{RFT_FLAGS[stray[0]]} sets the RFT stage: add --rft-rounds N (1 or more)")


def rft_settings(recipe: Recipe) -> dict[str, Any]:
    """What the RFT rounds (and every stage after them) are made with; nothing without RFT,
    so the records of a recipe without it are what they were before RFT existed."""
    if not recipe.rft_rounds:
        return {}
    return {name: getattr(recipe, name) for name in RFT_FLAGS}


def rft_seeds(recipe: Recipe, round_: int) -> range:
    """Round `round_`'s training seeds (1-based): right after the SFT stage's episodes
    (SOLVER_SEED_START onwards), a range of its own each round, so RFT never samples a
    state SFT was shown, nor a validation seed, nor one of the RL run's first seeds
    (`rollout.train_seed_start` = 10000, a few groups a step)."""
    from starpo.sft.data import SOLVER_SEED_START

    first = SOLVER_SEED_START + recipe.sft_episodes + (round_ - 1) * recipe.rft_seeds
    return range(first, first + recipe.rft_seeds)


def train_rft(
    recipe: Recipe, cfg: Any, folder: Path, model: str, round_: int, dtype: str
) -> dict[str, Any]:
    """RFT round `round_` from `model` into `folder`, training in `dtype` (SFT's): episodes
    sampled at the RL stage's temperature and layout, a batch the size of an RL step's;
    its record says what was sampled and kept, and the model it ends with."""
    from starpo.sft.options import TrainOptions
    from starpo.sft.rejection import rft_round

    options = TrainOptions(epochs=recipe.rft_epochs, lr=recipe.rft_lr, dtype=dtype)
    return rft_round(
        model,
        folder,
        cfg.env.id,
        cfg.rollout.settings(),
        seeds=rft_seeds(recipe, round_),
        samples_per_seed=recipe.rft_samples,
        options=options,
        env_kwargs=dict(cfg.env.kwargs),
        device=cfg.model.device,
        backend=cfg.rollout.backend,
        dtype=cfg.rollout.dtype,
        batch_size=cfg.rollout.num_groups * cfg.rollout.group_size,
        quiet=False,
    )


def round_summary(kept: dict[str, Any]) -> dict[str, Any]:
    """An RFT round's record as results.json shows it: where it sampled, how much it kept,
    the model it ended with."""
    keys = ("seeds", "samples_per_seed", "sampled", "kept", "kept_share", "model", "trained")
    return {key: kept.get(key) for key in keys}
