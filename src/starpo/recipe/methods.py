"""What the multi-turn recipe runs (`starpo.recipe.stages`): one `Recipe` per env (the RL preset
and the size of the SFT stage) and the RL methods `--methods` chooses between."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from starpo.defaults import WEAK_SKILL
from starpo.errors import UserError

#: What the SFT stage may learn from (`--sft-from`; see Recipe.sft_from).
SFT_SOURCES = ("solver", "random", "weak", "world-model")


@dataclass(frozen=True)
class Recipe:
    """One env's recipe: the RL preset and the size of the SFT stage (see the presets'
    comments for why these values)."""

    env: str
    preset: str  # shipped config of the RL stage; its rollout section shapes SFT and evals
    sft_episodes: int  # solver (or random-policy, see sft_from) episodes from training seeds
    sft_epochs: int
    sft_lr: float
    # What SFT learns from: "solver" play, "random" play (a format-only warm start: the
    # turn format without being shown how to solve; `starpo sft --from-random`), or "weak"
    # play (the solver's move with probability weak_skill, else a random one; a weak warm
    # start that leans towards good moves without solving; `starpo sft --from-weak`), or
    # "world-model" (random play whose think blocks read the state back and predict the
    # next one, SPA-style; `starpo sft --from-world-model`; turns thinking on).
    sft_from: str = "solver"
    weak_skill: float = WEAK_SKILL
    eval_seeds: int = 256  # validation seeds of every row (the 256)
    rl_minutes: float | None = None  # the RL stage's trainer.max_minutes (None: its steps)
    base_think_tokens: int = 128  # the base model's think-variant budget per turn ...
    base_think_seeds: int = 64  # ... and seeds: it writes ~10x the tokens of the others
    # env.kwargs of a held-out case family the SFT and RL stages never see (unseen vendor
    # names and problem types, an unseen policy clause); when set, the SFT and RL models are
    # also evaluated on it, on the same seeds: does what they learned carry over?
    heldout_kwargs: tuple[tuple[str, Any], ...] = ()
    # Rejection-sampling fine-tuning between SFT and RL (`starpo.sft.rejection`): rounds
    # (0: no RFT stage), training seeds a round, episodes sampled a seed, and the SFT run
    # on the kept ones. The rate is half SFT's: the data is the model's own replies, a
    # nudge towards those that worked rather than a new skill (reasoned, not measured).
    rft_rounds: int = 0
    rft_seeds: int = 128
    rft_samples: int = 8
    rft_epochs: int = 1
    rft_lr: float = 1e-4


# SFT lr 2e-4 for 3 epochs (46-69 AdamW steps of 8 dialogues, cosine): on Sokoban's 200
# solver dialogues the validation turn accuracy (replies exactly the solver's) reached
# 25.2%, 53.0%, 63.5% after epochs 1-3 and was still rising; at 2e-5 it stalled at 38.3%
# after 2 epochs and the model played at the random policy's level (11.3% success).
RECIPES: dict[str, Recipe] = {
    "sokoban": Recipe("sokoban", "cpu-sokoban-sft-starpo-s", 200, 3, 2e-4),
    "frozenlake": Recipe("frozenlake", "cpu-frozenlake-sft-starpo-s", 200, 3, 2e-4),
    # Tool-calling envs: dialogues of ~1,700 tokens (the tools' schemas in the system
    # message), so fewer gold episodes for the same SFT minutes.
    "invoice": Recipe(
        "invoice", "cpu-invoice-sft-starpo-s", 128, 2, 2e-4, heldout_kwargs=(("split", "heldout"),)
    ),
    "support": Recipe(
        "support", "cpu-support-sft-starpo-s", 128, 2, 2e-4, heldout_kwargs=(("split", "heldout"),)
    ),
}


@dataclass(frozen=True)
class RecipeChoices:
    """The caller's changes to an env's `Recipe` (`starpo demo --env`'s flags); None keeps
    the recipe's value."""

    eval_seeds: int | None = None
    sft_episodes: int | None = None
    sft_epochs: int | None = None
    sft_from: str | None = None
    weak_skill: float | None = None
    rl_minutes: float | None = None  # also turns the RL stage's steps into a minutes budget
    rft_rounds: int | None = None
    rft_seeds: int | None = None
    rft_samples: int | None = None
    rft_epochs: int | None = None
    rft_lr: float | None = None

    def chosen(self) -> dict[str, Any]:
        """The values the caller set, by Recipe field."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


@dataclass(frozen=True)
class Method:
    """An RL method of the recipe's RL stage: the preset plus `overrides`."""

    label: str  # its row is "SFT + <label>"
    overrides: tuple[str, ...]


#: The RL methods, by the name `--methods` takes; all keep the preset's StarPO-S settings.
METHODS: dict[str, Method] = {
    "grpo": Method("GRPO", ("algorithm.adv_estimator=grpo",)),
    "gigpo": Method("GiGPO", ("algorithm.adv_estimator=gigpo",)),
    # The critic doubles the update's activations: 4 episodes a micro-batch fit 24 GB
    # (starpo plan: 15.3 GiB against 25.2 at 8); the gradients do not depend on it.
    "ppo": Method("PPO", ("algorithm.adv_estimator=bi_level_gae", "optim.micro_batch_size=4")),
}
DEFAULT_METHODS = ("grpo",)


def check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """The names, each known and once; a one-line UserError otherwise."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise UserError(
            f"--methods takes one or more of {', '.join(METHODS)}, got "
            f"{' '.join(unknown) if unknown else 'none'}"
        )
    return tuple(dict.fromkeys(methods))


def recipe_for(env_id: str) -> Recipe:
    if env_id not in RECIPES:
        raise UserError(
            f"no multi-turn recipe for env {env_id!r}; choose one of: {', '.join(RECIPES)} "
            "(or run `starpo sft` and `starpo train` yourself)"
        )
    return RECIPES[env_id]
