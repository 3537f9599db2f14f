"""`make demo`: train the embedded SmolLM2-135M-Instruct with StarPO-S on the Bandit, on a
CPU, and show validation success before and after with 95% intervals.

    starpo demo                 # the training demo (about 3 minutes on 2 cores)
    starpo demo --envs          # each env played by the solver and a random agent
    starpo demo --steps 5       # a shorter run
    starpo demo --env sokoban   # the multi-turn recipe: base, SFT, SFT + StarPO-S
                            # (also frozenlake; see starpo.recipe)
    starpo demo --env sokoban --sft-episodes 400 --sft-epochs 5 --rl-minutes 30
    starpo demo --env frozenlake --sft-from world-model   # SPA-style world-model SFT
    starpo demo --env frozenlake --sft-from random --rft-rounds 1 --rft-seeds 128 \
        --rft-samples 8                                   # + rejection-sampling FT
"""

from __future__ import annotations

import argparse
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from starpo.cli.args import ListFlag, all_overrides
from starpo.errors import UserError

DEMO_ENVS = (
    "bandit",
    "bandit-rev",
    "frozenlake",
    "sokoban",
    "sokoban-large",
    "sokoban-newvocab",
    "countdown",
    "countdown-multi",
    "sudoku",
    "qa",
    "2048-3x3",
    "invoice",
    "support",
)
DEMO_SEED = 123
DEMO_PRESET = "cpu-bandit-starpo-s"  # shipped in starpo/config/presets/


# --------------------------------------------------------------------- env showcase
def show_episode(env_id: str, policy_name: str, seed: int = DEMO_SEED) -> bool:
    """Print one episode frame by frame; return its success."""
    from starpo.envs import make
    from starpo.envs.policies import make_policy
    from starpo.evaluation.scripted import run_episode

    env = make(env_id)
    policy = make_policy(policy_name, seed=seed)
    episode = run_episode(env, policy, seed=seed, env_id=env_id, policy_name=policy_name)
    print(f"--- {env_id} | policy={policy_name} | seed={seed} ---")
    print(episode.initial_observation)
    for i, step in enumerate(episode.steps, 1):
        print(f"\naction {i}: {step.action}  reward {step.reward:+g}")
        # A tool env's case stays as first shown; what the call returned is the news.
        print(step.observation if step.tool_result is None else f"-> {step.tool_result}")
    verdict = "SUCCESS" if episode.success else "failure"
    total = episode.total_reward
    odds = episode.optimal_success_prob
    chance = "" if odds is None else f" (an optimal policy succeeds w.p. {odds:.2f} here)"
    print(f"=> {verdict} after {episode.num_actions} actions, total reward {total:+g}{chance}\n")
    return episode.success


def show_envs() -> None:
    results = {}
    for env_id in DEMO_ENVS:
        for policy_name in ("solver", "random"):
            results[(env_id, policy_name)] = show_episode(env_id, policy_name)
    print(f"summary (seed {DEMO_SEED}):")
    for (env_id, policy_name), success in results.items():
        print(f"  {env_id:<18}{policy_name:<8}{'success' if success else 'failure'}")


# ------------------------------------------------------------------- training demo
def validation_line(label: str, row: dict[str, Any], key: str) -> str:
    low, high = row[f"{key}/success_ci95_low"], row[f"{key}/success_ci95_high"]
    return (
        f"{label:<7} step {row['step']:>3}: success {row[f'{key}/success']:6.1%}  "
        f"(95% CI {low:.1%} - {high:.1%}), format ok {row[f'{key}/format_ok']:.1%}"
    )


def train_demo(out: Path, overrides: list[str]) -> int:
    from starpo.config import load_config
    from starpo.trainer import Trainer

    cfg = load_config(DEMO_PRESET, overrides)
    print(
        f"StarPO-S on '{cfg.env.id}' with {cfg.model.name} on the CPU: "
        f"{cfg.trainer.total_steps} steps x {cfg.rollout.num_groups} groups x "
        f"{cfg.rollout.group_size} rollouts; validation on {cfg.trainer.val_seeds} fixed seeds.",
        flush=True,
    )
    started = time.perf_counter()
    history = Trainer(cfg, out).train()
    minutes = (time.perf_counter() - started) / 60
    key = f"val/{cfg.env.validation_id}"
    validated = [row for row in history if f"{key}/success" in row]
    before, after = validated[0], validated[-1]
    print(f"\ntrained in {minutes:.1f} min; run folder {out}")
    print(validation_line("before", before, key))
    print(validation_line("after", after, key))
    beyond = after[f"{key}/success_ci95_low"] > before[f"{key}/success_ci95_high"]
    print("improvement beyond the 95% intervals: " + ("yes" if beyond else "NO"))
    print(
        f"evaluate it again: starpo eval --env {cfg.env.id} --policy model "
        f"--model {out / 'final'} --no-think --out {out / 'eval'}"
    )
    return 0 if beyond else 1


#: The recipe's own flags: they mean nothing without --env.
RECIPE_FLAGS = (
    "eval_seeds",
    "sft_episodes",
    "sft_epochs",
    "sft_from",
    "weak_skill",
    "rl_minutes",
    "rft_rounds",
    "rft_seeds",
    "rft_samples",
    "rft_epochs",
    "rft_lr",
    "methods",
)


def add_parser(sub: Any) -> None:
    from starpo.recipe.methods import DEFAULT_METHODS, METHODS, RECIPES, SFT_SOURCES

    recipe = RECIPES["sokoban"]  # the defaults shown in --help (frozenlake's are the same)
    parser = sub.add_parser(
        "demo",
        help="train the embedded model on the Bandit (make demo), or run the multi-turn "
        "recipe with --env",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--envs", action="store_true", help="show the envs instead of training")
    parser.add_argument("--steps", type=int, default=None, help="training steps (preset's)")
    parser.add_argument("--out", default=None, help="run folder (default runs/demo-<time>)")
    parser.add_argument(
        "--env",
        default=None,
        help="run the multi-turn recipe on this env (sokoban, frozenlake, invoice or support): "
        "base model, SFT on solver play, then StarPO-S, on the same validation seeds; --out "
        "resumes it",
    )
    parser.add_argument(
        "--quick", action="store_true", help="with --env: a few seeds and steps, to try the path"
    )
    parser.add_argument(
        "--eval-seeds",
        type=int,
        default=None,
        help="with --env: validation seeds of each row (default 256)",
    )
    parser.add_argument(
        "--sft-episodes",
        type=int,
        default=None,
        help=f"with --env: solver episodes SFT learns from (default {recipe.sft_episodes})",
    )
    parser.add_argument(
        "--sft-epochs",
        type=int,
        default=None,
        help=f"with --env: SFT epochs (default {recipe.sft_epochs})",
    )
    parser.add_argument(
        "--sft-from",
        default=None,
        choices=SFT_SOURCES,
        help="with --env: what SFT learns from: solver play (default), random play (a "
        "format-only warm start: well-formed turns, no solving shown), weak play (the "
        "solver's move with probability --weak-skill, else a random one) or world-model "
        "(random play whose think block reads the state back and predicts the next one; "
        "turns thinking on: rollout.think=true rollout.max_new_tokens=128)",
    )
    parser.add_argument(
        "--weak-skill",
        type=float,
        default=None,
        metavar="P",
        help=f"with --sft-from weak: share of the weak policy's moves that are the solver's "
        f"(default {recipe.weak_skill})",
    )
    parser.add_argument(
        "--rl-minutes",
        type=float,
        default=None,
        help="with --env: the RL stage's budget of training minutes (trainer.max_minutes; "
        "validation excluded) instead of the preset's steps; --steps still caps it",
    )
    rft = parser.add_argument_group(
        "rejection-sampling fine-tuning (with --env; between SFT and RL, off by default)"
    )
    rft.add_argument(
        "--rft-rounds",
        type=int,
        default=None,
        metavar="R",
        help="rounds of RFT: sample from the newest model on training seeds, keep the "
        "successful episodes, fine-tune on them; RL starts from the last round's model "
        "(default 0: no RFT)",
    )
    rft.add_argument(
        "--rft-seeds",
        type=int,
        default=None,
        metavar="N",
        help=f"training seeds a round samples on, after SFT's (default {recipe.rft_seeds})",
    )
    rft.add_argument(
        "--rft-samples",
        type=int,
        default=None,
        metavar="K",
        help=f"episodes sampled a seed (default {recipe.rft_samples})",
    )
    rft.add_argument(
        "--rft-epochs",
        type=int,
        default=None,
        help=f"epochs over a round's kept episodes (default {recipe.rft_epochs})",
    )
    rft.add_argument(
        "--rft-lr",
        type=float,
        default=None,
        help=f"peak learning rate of a round (default {recipe.rft_lr:g})",
    )
    parser.add_argument(
        "--methods",
        action=ListFlag,
        default=None,
        metavar="METHOD",
        help=f"with --env: RL methods to train from the same SFT model, each with the same "
        f"budget, space- or comma-separated: {', '.join(METHODS)} "
        f"(default {' '.join(DEFAULT_METHODS)})",
    )
    parser.add_argument(
        "--no-base",
        action="store_true",
        help="with --env: leave out the base model's rows (they never change with the "
        "SFT or RL settings)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="dotted config overrides of the preset, e.g. trainer.total_steps=20",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The demo, or the recipe with --env, or the env list with --envs."""
    if args.envs:
        show_envs()
        return 0
    stray = [name for name in RECIPE_FLAGS if getattr(args, name) is not None]
    stray += ["no_base"] if args.no_base else []
    if stray and args.env is None:
        flag = "--" + stray[0].replace("_", "-")
        raise UserError(
            f"{flag} sets the multi-turn recipe's stages: add --env sokoban (or frozenlake)"
        )
    overrides = all_overrides(args)
    if args.steps is not None:
        overrides.append(f"trainer.total_steps={args.steps}")
    if args.env is not None:
        from starpo.recipe.methods import DEFAULT_METHODS, RecipeChoices
        from starpo.recipe.stages import run_recipe

        name = f"runs/recipe-{args.env}-{time.strftime('%Y%m%d-%H%M%S')}"
        choices = RecipeChoices(**{f.name: getattr(args, f.name) for f in fields(RecipeChoices)})
        run_recipe(
            args.env,
            Path(args.out or name),
            choices,
            quick=args.quick,
            overrides=overrides,
            methods=args.methods or DEFAULT_METHODS,
            base_rows=not args.no_base,
        )
        return 0
    out = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    return train_demo(out, overrides)
