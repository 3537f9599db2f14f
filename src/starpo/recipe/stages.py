"""The multi-turn recipe on a laptop CPU: base model, SFT on solver play, then StarPO-S.

    starpo demo --env sokoban      # or frozenlake
    starpo demo --env sokoban --out runs/recipe-sokoban   # resumes a stopped run

Stages, each in a folder of its own under `--out` (a stage whose result is already there is
not run again, so a stopped recipe resumes where it was):

1. `base/`: the base model on the validation seeds.
2. `sft/`: `starpo sft` on solver episodes from training seeds (never the validation
   seeds), laid out exactly as the RL run's rollouts (the preset's rollout section).
   `--sft-from random|weak|world-model` learns from other play instead (world-model:
   random play whose think blocks read the state back and predict the next one; it turns
   thinking on, `WORLD_MODEL_OVERRIDES`).
3. `sft-eval/`: the SFT model on the validation seeds.
   With `--rft-rounds R`: `rft-1/` ... `rft-R/`, rejection-sampling fine-tuning
   (`starpo.sft.rejection`): each round samples `--rft-samples` episodes on each of
   `--rft-seeds` training seeds from the newest model, keeps the successes and fine-tunes
   on them; `rft-eval/` scores the last one (row "SFT + RFT"), and RL starts from it.
4. `rl-<method>/`: `starpo train` with the env's CPU preset (StarPO-S: top-25% groups by
   reward std, clip-higher, no KL) from the SFT model, once per method (`--methods`):
   `grpo` (the preset's), `gigpo` (step-level credit) or `ppo` (a critic, bi-level GAE).
   With `--rl-minutes` every method gets the same budget of training minutes.
5. `rl-<method>-eval/`: each trained policy on the validation seeds.
   Where the env has a held-out case family (`Recipe.heldout_kwargs`: invoice's and
   support's `split=heldout`), `sft-heldout-eval/` and `rl-<method>-heldout-eval/` score the
   SFT and RL models on it too, on the same seeds.
6. `base-think/`: the base model with a think block, on the first 64 seeds under a short
   budget (it never closes its think block: 400 tokens a turn would cost an hour).

`--no-base` leaves out stages 1 and 6 (the base model's rows never change with the SFT or
RL settings). Every evaluation uses the same seeds and settings (the preset's rollout section at its
validation temperature), so the rows compare; `results.json` holds the table, with 95%
Wilson intervals, the settings of SFT and RL in the row labels, and the minutes each
stage took. Each stage from SFT on records the settings it was made with
(`--sft-episodes`, `--sft-epochs`, `--rl-minutes`, RL's steps): a resumed recipe asked
for other settings stops with one line before any work, rather than reuse results made
another way; one asked only for a longer RL budget continues the RL run from its last
checkpoint (`continue_longer`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from starpo.config.fields import show
from starpo.envs.policies import check_skill
from starpo.errors import UserError
from starpo.recipe.methods import (
    DEFAULT_METHODS,
    METHODS,
    SFT_SOURCES,
    Recipe,
    RecipeChoices,
    check_methods,
    recipe_for,
)
from starpo.recipe.results import (
    format_results,
    heldout_label,
    rft_label,
    rl_label,
    sft_label,
    stage_minutes,
)
from starpo.recipe.rft import RFT_FLAGS, check_rft, rft_settings, round_summary, train_rft

RESULTS_FILE = "results.json"


#: trainer.total_steps of an RL stage given --rl-minutes: more than any budget fits, so the
#: minutes bind. The CPU presets' learning rate is constant; a cosine schedule (which
#: decays over total_steps) would barely move.
BUDGETED_STEPS = 100_000

#: The recipe's flags (and RL's steps) by the names stages record their settings under.
FLAGS = {
    "sft_episodes": "--sft-episodes",
    "sft_epochs": "--sft-epochs",
    "sft_lr": "SFT lr",
    "sft_from": "--sft-from",
    "weak_skill": "--weak-skill",
    "eval_seeds": "--eval-seeds",
    "rl_minutes": "--rl-minutes",
    **RFT_FLAGS,
    "rl_steps": "trainer.total_steps",
    "base_model": "model.name",
    "env_kwargs": "env.kwargs",
    "layout": "rollout settings",
}
#: What the SFT stage records since 2026-12-04; a stage recorded before holds none of them
#: and is taken as it is on these (and on the RL settings' dotted keys, recorded since
#: 2026-12-06).
LATER_KEYS = ("base_model", "env_kwargs", "layout")
#: The RL run's settings its stages record as dotted config keys (`rl_settings`): whole
#: sections, and the trainer's that change what it learns or how it is scored.
RL_SECTIONS = ("rollout", "filter", "curriculum", "algorithm", "optim")
RL_TRAINER_KEYS = ("seed", "on_collapse", "stop_at_success", "val_temperature")
#: Not recorded: they change speed, not the result (the update does not depend on the
#: micro-batch size; bf16 or fp32 is the machine's choice under `auto`).
RL_UNRECORDED = ("rollout.workers", "rollout.backend", "rollout.dtype", "rollout.env_timeout_s",
                 "optim.micro_batch_size")  # fmt: skip


# ---------------------------------------------------------------------------- stages
def run_stage(
    folder: Path,
    name: str,
    work: Callable[[], dict[str, Any]],
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`work()` once: its result is kept in `folder/stage.json` with its minutes (and the
    `settings` it was made with: see `check_kept_settings`), and a later call returns the
    kept result (resume) instead of running it again."""
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
    if settings is not None:
        kept["settings"] = settings
    folder.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")
    print(f"[{name}] {kept['minutes']:.1f} min", flush=True)
    return kept


def evaluate(
    model: str, cfg: Any, folder: Path, settings: Any, seeds: int, env_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """`model` on `seeds` validation seeds from the preset's first one, the env made with
    `env_kwargs`; writes `starpo eval`'s files in `folder`."""
    from starpo.evaluation.model import evaluate_model, progress_bar
    from starpo.evaluation.summary import write_results

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
            env_kwargs=env_kwargs,
            on_turn=show,
        )
    write_results(folder, result.trajectories, summary)
    keys = ("success", "success_ci95_low", "success_ci95_high", "format_ok", "num_episodes")
    judged = {k: summary[k] for k in ("optimal_action_rate",) if k in summary}
    return {"model": model, **{k: summary[k] for k in keys}, **judged}


#: The recipe as it is.
NO_CHOICES = RecipeChoices()

QUICK = ["trainer.val_seeds=8", "trainer.total_steps=2", "trainer.val_every=0"]

#: What `--sft-from world-model` sets in the preset before the caller's overrides: its
#: turns think (the state and its successor are written in the think block), and a turn
#: needs room for two renders of the board (a 6x6 Sokoban turn is 66 tokens, a 4x4
#: FrozenLake one 49, with the default tokenizer).
WORLD_MODEL_OVERRIDES = ("rollout.think=true", "rollout.max_new_tokens=128")


def _check_count(flag: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise UserError(f"{flag} must be at least 1, got {value}")


def configure(
    env_id: str,
    choices: RecipeChoices = NO_CHOICES,
    *,
    quick: bool = False,
    overrides: Sequence[str] = (),
) -> tuple[Recipe, list[str]]:
    """`env_id`'s recipe with the caller's `choices` (see `run_recipe`), and the overrides
    of its RL preset; a bad choice is a one-line UserError naming its flag. The caller's
    values win over `quick`'s, and its overrides (`--steps`) over `rl_minutes`' steps."""
    recipe = recipe_for(env_id)
    if quick:
        recipe = replace(
            recipe, sft_episodes=16, sft_epochs=1, eval_seeds=8, rft_seeds=8, rft_samples=4
        )
    for name in ("eval_seeds", "sft_episodes", "sft_epochs", "rft_seeds", "rft_samples",
                 "rft_epochs"):  # fmt: skip
        _check_count(FLAGS[name], getattr(choices, name))
    check_rft(choices)
    if choices.sft_from is not None and choices.sft_from not in SFT_SOURCES:
        raise UserError(
            f"--sft-from must be one of {', '.join(SFT_SOURCES)}, got {choices.sft_from!r}"
        )
    if choices.weak_skill is not None:
        if choices.sft_from != "weak":
            raise UserError(
                "--weak-skill sets the weak policy SFT learns from: add --sft-from weak"
            )
        check_skill(choices.weak_skill)
    rl_minutes = choices.rl_minutes
    if rl_minutes is not None and not (math.isfinite(rl_minutes) and rl_minutes > 0):
        raise UserError(f"--rl-minutes must be a number of minutes above 0, got {rl_minutes:g}")
    recipe = replace(recipe, **choices.chosen())
    budget = []
    if rl_minutes is not None:
        budget = [f"trainer.total_steps={BUDGETED_STEPS}", f"trainer.max_minutes={rl_minutes!r}"]
    world = WORLD_MODEL_OVERRIDES if recipe.sft_from == "world-model" else ()
    return recipe, [*(QUICK if quick else []), *budget, *world, *overrides]


def sft_settings(recipe: Recipe, cfg: Any) -> dict[str, Any]:
    """What the SFT stage (and every stage after it) is made with: its episodes, epochs and
    rate, the base model, the env's arguments and the rollout settings that lay out its
    examples (`cfg`: the RL preset's config). The source of its episodes only when it is
    not the solver (folders made before it could be chosen recorded none, and are
    solver-made)."""
    made: dict[str, Any] = {
        "sft_episodes": recipe.sft_episodes,
        "sft_epochs": recipe.sft_epochs,
        "sft_lr": recipe.sft_lr,
    }
    if recipe.sft_from != "solver":
        made["sft_from"] = recipe.sft_from
    if recipe.sft_from == "weak":
        made["weak_skill"] = recipe.weak_skill
    made["base_model"] = cfg.model.name
    made["env_kwargs"] = dict(cfg.env.kwargs)
    made["layout"] = cfg.rollout.settings().layout()
    return json.loads(json.dumps(made))  # as stage.json keeps it (tuples as lists)


def rl_settings(rl_cfg: Any) -> dict[str, Any]:
    """What an RL stage is made with beyond its SFT model and budget, as dotted config keys
    (`optim.actor_lr`: 2e-05), so a finished run is not reused for another learning rate,
    batch, filter or estimator."""
    from starpo.config import config_to_dict

    full = config_to_dict(rl_cfg)
    made = {f"{sec}.{key}": value for sec in RL_SECTIONS for key, value in full[sec].items()}
    made.update({f"trainer.{key}": full["trainer"][key] for key in RL_TRAINER_KEYS})
    kept = {key: value for key, value in made.items() if key not in RL_UNRECORDED}
    return json.loads(json.dumps(kept))  # as stage.json keeps it (tuples as lists)


def _later(key: str) -> bool:
    """A key that stages recorded before some date: one a record lacks is taken as it is."""
    return key in LATER_KEYS or "." in key


def _show(key: str, value: Any) -> str:
    if "." in key:  # an RL setting, as its override is written
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return f"{key}={value:g}" if number else f"{key}={show(value)}"  # show: YAML
    flag = FLAGS.get(key, key)
    if key == "sft_from":  # recorded only when not the solver (see sft_settings)
        return f"{flag} {value or 'solver'}"
    if value is None:
        return f"no {flag}"
    return f"{flag} {value:g}" if isinstance(value, (int, float)) else f"{flag} {show(value)}"


def check_kept_settings(
    out: Path, wanted: dict[str, dict[str, Any]], checked: Collection[str] | None = None
) -> None:
    """Refuse, in one line and before any work, to resume a recipe folder whose finished
    stages were made with other settings than `wanted` (stage folder -> settings, in the
    order the stages depend on each other; `checked`: only these folders). A stage that
    recorded no settings (made before they were recorded) is taken as it is."""
    folders = list(wanted)
    for i, folder in enumerate(folders):
        if checked is not None and folder not in checked:
            continue
        kept = _kept_settings(out / folder)
        if kept is None:
            continue
        keys = _differing(kept, wanted[folder])
        if not keys:
            continue
        made = ", ".join(_show(k, kept.get(k)) for k in keys)
        asked = ", ".join(_show(k, wanted[folder].get(k)) for k in keys)
        redo = ", ".join(folders[i:])
        raise UserError(
            f"{out / folder} was made with {made}, not {asked}: pass the same settings to "
            f"resume, choose another --out, or delete {redo} in {out} to redo them"
        )


#: An RL stage's settings that a longer run of it only raises (see `continue_longer`).
BUDGET_KEYS = ("rl_steps", "rl_minutes")


def _differing(kept: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """The settings whose recorded value is not the wanted one; a key recorded only since
    some date (`_later`) that the record lacks is taken as it is."""
    asking = {k: v for k, v in wanted.items() if k in kept or not _later(k)}
    return [k for k in {**kept, **asking} if kept.get(k) != asking.get(k)]


def _asks_longer(kept: dict[str, Any], asked: dict[str, Any]) -> bool:
    """Whether `asked` is `kept` with more steps or minutes (None: no minute budget) and
    neither lowered, all else the same."""
    if any(k not in BUDGET_KEYS for k in _differing(kept, asked)):
        return False

    def bound(value: Any) -> float:
        return math.inf if value is None else value

    pairs = [(bound(kept.get(k)), bound(asked.get(k))) for k in BUDGET_KEYS]
    return all(now >= was for was, now in pairs) and any(now > was for was, now in pairs)


def continue_longer(
    out: Path, method: str, rl_cfg: Any, asked: dict[str, Any], evals: Sequence[str]
) -> None:
    """Let a finished RL stage run on: asked for more steps or minutes than it was made
    with, and otherwise the same settings, its run continues from its last checkpoint
    (`train_rl` resumes) and is evaluated again. Its record and evaluation folders
    (`evals`) move aside to `...-step<N>`, kept rather than lost. Only with a constant
    learning rate: a cosine schedule decays over total_steps, so the longer run would not
    be the shorter one continued (`check_kept_settings` then refuses it in one line)."""
    from starpo.trainer.checkpoints.store import latest_checkpoint

    rl_dir = out / f"rl-{method}"
    record = rl_dir / "recipe" / "stage.json"
    kept = _kept_record(rl_dir) if record.exists() else None
    if kept is None or kept.get("settings") is None or not _asks_longer(kept["settings"], asked):
        return
    if rl_cfg.optim.lr_schedule != "constant" or latest_checkpoint(rl_dir) is None:
        return
    steps = kept.get("steps", "?")
    moves = [(record, record.with_name(f"stage-step{steps}.json"))]
    moves += [(out / f, out / f"{f}-step{steps}") for f in evals if (out / f).exists()]
    taken = [str(target) for _, target in moves if target.exists()]
    if taken:
        raise UserError(
            f"{taken[0]} is in the way of continuing {rl_dir} from step {steps}: "
            "move or delete it, then run again"
        )
    for source, target in moves:
        source.rename(target)
    budget = ", ".join(_show(k, asked.get(k)) for k in BUDGET_KEYS)
    print(
        f"[RL {method}] made with {steps} steps: continuing from its checkpoint ({budget}); "
        f"the earlier record and evaluations are kept as *-step{steps}",
        flush=True,
    )


def _kept_record(folder: Path) -> dict[str, Any] | None:
    """A finished stage's record (an RL stage's is in its recipe/), or None: not finished,
    or unreadable (run_stage runs it again)."""
    nested = folder / "recipe" / "stage.json"
    record = nested if nested.exists() else folder / "stage.json"
    try:
        kept = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return kept if isinstance(kept, dict) else None


def _kept_settings(folder: Path) -> dict[str, Any] | None:
    """The settings a finished stage recorded, or None."""
    return (_kept_record(folder) or {}).get("settings")


def _sft_dtype(cfg: Any) -> str:
    """SFT (and RFT) compute in the RL stage's dtype (auto: bf16 autocast where the CPU has
    it)."""
    import torch

    from starpo.models.precision import compute_dtype

    return "bf16" if compute_dtype(cfg.model.dtype, cfg.model.device) == torch.bfloat16 else "fp32"


def train_sft(recipe: Recipe, cfg: Any, sft_dir: Path) -> dict[str, Any]:
    """The SFT stage: `starpo sft` on solver (or random-policy, weak or world-model:
    `recipe.sft_from`) episodes of training seeds, laid out as the RL preset's rollouts,
    from `cfg.model.name` into `sft_dir`."""
    from starpo.sft import run_sft
    from starpo.sft.train import TrainOptions

    options = TrainOptions(epochs=recipe.sft_epochs, lr=recipe.sft_lr, dtype=_sft_dtype(cfg))
    summary = run_sft(
        cfg.model.name,
        (),
        cfg.rollout.settings(),
        sft_dir,
        options=options,
        from_solver=recipe.sft_episodes if recipe.sft_from == "solver" else 0,
        from_random=recipe.sft_episodes if recipe.sft_from == "random" else 0,
        from_weak=recipe.sft_episodes if recipe.sft_from == "weak" else 0,
        from_world_model=recipe.sft_episodes if recipe.sft_from == "world-model" else 0,
        weak_skill=recipe.weak_skill,
        env_id=cfg.env.id,
        env_kwargs=dict(cfg.env.kwargs),
        device=cfg.model.device,
        # The policy plays as many actions a turn as the RL stage's turns hold: a layout of
        # 3 actions a turn in 4 turns must not learn from turns of one action (4 in all).
        actions_per_turn=cfg.rollout.max_actions_per_turn,
    )
    return {"epochs": summary["epochs"], "data": summary["data"]}


def train_rl(rl_cfg: Any, rl_dir: Path) -> dict[str, Any]:
    """The RL stage: `starpo train` into `rl_dir`, continuing its run when a stopped recipe
    left a checkpoint; the last step and the training minutes it took (all parts)."""
    from starpo.runs.metrics import read_metrics
    from starpo.timing import train_minutes
    from starpo.trainer import Trainer
    from starpo.trainer.checkpoints.store import latest_checkpoint

    resume = latest_checkpoint(rl_dir) is not None
    Trainer(rl_cfg, rl_dir, resume=resume).train()
    rows = read_metrics(rl_dir)
    return {
        "steps": rows[-1]["step"] if rows else 0,
        "train_minutes": train_minutes(rows)[-1] if rows else 0.0,
    }


def run_recipe(
    env_id: str,
    out: Path,
    choices: RecipeChoices = NO_CHOICES,
    *,
    quick: bool = False,
    overrides: Sequence[str] = (),
    methods: Sequence[str] = DEFAULT_METHODS,
    base_rows: bool = True,
) -> dict[str, Any]:
    """All stages for `env_id` under `out`; returns (and writes) the results table.
    `choices`: the caller's changes to the env's recipe (validation seeds of each row, the
    SFT stage's source, episodes and epochs, the RL stage's budget of training minutes:
    trainer.max_minutes, its steps then do not bind unless `overrides` set them);
    `quick`: a few seeds, steps and episodes, to try the whole path in minutes;
    `overrides`: dotted config overrides of the RL preset (its model.name is the base);
    `methods`: the RL methods (METHODS), each from the same SFT model; `base_rows`: also
    evaluate the base model (with and without a think block)."""
    from starpo.compute.machine import describe_machine, today
    from starpo.config import load_config

    methods = check_methods(methods)
    asked = list(overrides)  # the caller's own, kept in results.json
    recipe, overrides = configure(env_id, choices, quick=quick, overrides=overrides)
    cfg = load_config(recipe.preset, overrides)
    if recipe.sft_from == "world-model":
        from starpo.sft.responses import check_world_model_think

        check_world_model_think(cfg.rollout.think)  # a caller's rollout.think=false
    sft_dir = out / "sft"
    made = sft_settings(recipe, cfg)
    rl_cfgs, rl_made, rl_evals = {}, {}, {}
    held = ("heldout-eval",) if recipe.heldout_kwargs else ()
    wanted = {"sft": made, **{f"sft-{stage}": made for stage in ("eval", *held)}}
    rft_made = {**made, **rft_settings(recipe)}
    rft_folders = [f"rft-{r}" for r in range(1, recipe.rft_rounds + 1)]
    # Round r is made by rounds 1..r alone: a run asked for one more round keeps the
    # rounds it has (sampling is most of a round's time) and adds the next.
    round_made = [{**rft_made, "rft_rounds": r} for r in range(1, recipe.rft_rounds + 1)]
    wanted.update(zip(rft_folders, round_made, strict=True))
    rft_evals = [f"rft-{stage}" for stage in ("eval", *held)] if rft_folders else []
    wanted.update(dict.fromkeys(rft_evals, rft_made))

    def rl_config(name: str, start: str | Path) -> Any:
        return load_config(
            recipe.preset, [*overrides, *METHODS[name].overrides, f"model.name={start}"]
        )

    for name in methods:
        rl_cfgs[name] = rl_config(name, sft_dir)
        steps = rl_cfgs[name].trainer.total_steps
        rl_made[name] = {
            **rft_made, "rl_minutes": recipe.rl_minutes, "rl_steps": steps,
            **rl_settings(rl_cfgs[name]),
        }  # fmt: skip
        rl_evals[name] = [f"rl-{name}-{stage}" for stage in ("eval", *held)]
        for folder in (f"rl-{name}", *rl_evals[name]):
            wanted[folder] = rl_made[name]
    check_kept_settings(out, wanted, checked=[k for k in wanted if not k.startswith("rl-")])
    for name in methods:  # a longer RL budget continues a finished run, its SFT kept
        continue_longer(out, name, rl_cfgs[name], rl_made[name], rl_evals[name])
    check_kept_settings(out, wanted)
    settings = cfg.rollout.settings(temperature=cfg.trainer.val_temperature)
    think_settings = settings.model_copy(
        update={"think": True, "max_new_tokens": recipe.base_think_tokens}
    )
    base = cfg.model.name

    heldout = {**cfg.env.kwargs, **dict(recipe.heldout_kwargs)}

    def evaluation(
        name: str, folder: str, model: str, play: Any = settings, seeds: int = recipe.eval_seeds,
        made: dict[str, Any] | None = None, env_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        where, kwargs = out / folder, dict(cfg.env.kwargs if env_kwargs is None else env_kwargs)
        return run_stage(
            where, name, lambda: evaluate(model, cfg, where, play, seeds, kwargs), made
        )

    def heldout_row(row: str, name: str, folder: str, model: str, made: dict[str, Any]) -> None:
        """`model` on the held-out case family too, when the env has one: row "`row`
        (held-out)"."""
        if recipe.heldout_kwargs:
            kept = evaluation(f"{name} held-out", folder, model, made=made, env_kwargs=heldout)
            label = f"{rows[row].get('label', row)}, {heldout_label(recipe.heldout_kwargs)}"
            rows[f"{row} (held-out)"] = {**kept, "label": label, "env_kwargs": heldout}

    rows = {"base": evaluation("base", "base", base)} if base_rows else {}
    run_stage(sft_dir, "sft", lambda: train_sft(recipe, cfg, sft_dir), made)
    rows["SFT"] = evaluation("SFT eval", "sft-eval", str(sft_dir), made=made)
    rows["SFT"]["label"] = sft_label(recipe)
    heldout_row("SFT", "SFT eval", "sft-heldout-eval", str(sft_dir), made)
    start, rounds = str(sft_dir), []
    for r, folder in enumerate(rft_folders, 1):
        work = partial(train_rft, recipe, cfg, out / folder, start, r, _sft_dtype(cfg))
        rounds.append(run_stage(out / folder, f"RFT {r}", work, round_made[r - 1]))
        start = rounds[-1]["model"]  # the next round samples from the newest model
    if rft_folders:
        rows["SFT + RFT"] = evaluation("RFT eval", "rft-eval", start, made=rft_made)
        rows["SFT + RFT"]["label"] = rft_label(recipe, rounds)
        heldout_row("SFT + RFT", "RFT eval", "rft-heldout-eval", start, rft_made)
    ran = {}
    for name in methods:
        rl_dir, label = out / f"rl-{name}", METHODS[name].label
        rl_cfg = rl_cfgs[name] if start == str(sft_dir) else rl_config(name, start)
        label = f"RFT + {label}" if rft_folders else label
        rl = run_stage(
            rl_dir / "recipe", f"RL {name}", partial(train_rl, rl_cfg, rl_dir), rl_made[name]
        )
        row = evaluation(
            f"RL {name} eval", f"rl-{name}-eval", str(rl_dir / "final"), made=rl_made[name]
        )
        rows[f"SFT + {label}"] = {**row, "label": rl_label(label, rl, recipe.rl_minutes)}
        heldout_row(
            f"SFT + {label}", f"RL {name} eval", f"rl-{name}-heldout-eval",
            str(rl_dir / "final"), rl_made[name],
        )  # fmt: skip
        ran[name] = {"steps": rl.get("steps"), "train_minutes": rl.get("train_minutes")}
    if base_rows:
        # Last: the least telling row (the base model never closes its think block), and
        # the costliest per episode.
        seeds = min(recipe.base_think_seeds, recipe.eval_seeds)
        rows["base, think"] = evaluation("base, think", "base-think", base, think_settings, seeds)
    results = {
        "machine": describe_machine(),  # every figure names its machine (DESIGN.md)
        "date": today(),
        "env": env_id,
        "preset": recipe.preset,
        "env_kwargs": dict(cfg.env.kwargs),
        "val_seed_start": cfg.trainer.val_seed_start,
        "settings": {**rft_made, "rl_minutes": recipe.rl_minutes, "methods": list(methods)},
        "overrides": asked,
        **({"rft_rounds": [round_summary(r) for r in rounds]} if rounds else {}),
        "rl_runs": ran,
        "rows": rows,
        "minutes": stage_minutes(out),
    }
    (out / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(format_results(results))
    return results
