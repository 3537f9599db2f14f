"""A training checkpoint's policy as a plain Hugging Face model folder, so any saved step,
not only a finished run's `final/`, can be evaluated (`starpo eval --model`), served,
fine-tuned or probed like any model. `starpo export` is its command."""

from __future__ import annotations

from pathlib import Path

from starpo import runs
from starpo.errors import UserError
from starpo.trainer.checkpoints.store import (
    META_FILE,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
)


def find_checkpoint(source: Path, step: int | None = None) -> Path:
    """The checkpoint folder `source` names: itself when it is one (`step`, if given, must
    be its step), else the run folder's newest checkpoint or its checkpoint of `step`."""
    source = Path(source)
    if not source.is_dir():
        raise UserError(f"{source} does not exist: give a run folder or a checkpoint folder")
    if (source / META_FILE).is_file():
        saved = checkpoint_step(source)
        if step is not None and step != saved:
            raise UserError(f"{source} is the checkpoint of step {saved}, not {step}: drop --step")
        return source
    checkpoints = runs.RunFolder(source).checkpoints
    kept = dict(runs.step_dirs(checkpoints))
    if not kept:
        raise UserError(
            f"{source} holds no checkpoints (looked in {checkpoints}); "
            "a finished run's model is already a model folder: its final/"
        )
    if step is None:
        newest = latest_checkpoint(source)
        if newest is None:
            raise UserError(f"every checkpoint in {source} is incomplete or corrupt")
        return newest
    if step not in kept:
        steps = ", ".join(str(s) for s in sorted(kept))
        raise UserError(
            f"{source} keeps no checkpoint of step {step} (it keeps step {steps}; "
            "trainer.keep_checkpoints and trainer.keep_every set which a run keeps)"
        )
    return kept[step]


def export_checkpoint(checkpoint: Path, out: Path, *, base: str | None = None) -> Path:
    """Write the policy saved in the `checkpoint` folder (`find_checkpoint` names it) to
    `out` as a Hugging Face folder (LoRA merged), in fp32 as the trainer keeps its master
    weights. The checkpoint holds only the trainable weights: the rest come from the run's
    `model.name`, or `base` when that path no longer resolves from here."""
    from starpo.compute.weights import export_policy, load_trainable_state
    from starpo.config import config_from_dict
    from starpo.models import load_model
    from starpo.trainer.train_models import apply_lora

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} already exists and is not empty: choose another --out")
    state = load_checkpoint(checkpoint)
    cfg = config_from_dict(state["config"])
    name = base or cfg.model.name
    try:
        model, tokenizer = load_model(name, dtype="fp32")
    except UserError as exc:
        if base:
            raise
        where = "the run's recorded model.name: give --base to load it from elsewhere"
        raise UserError(f"{exc} ({where})") from exc
    lora = cfg.model.lora.enabled
    if lora:
        model = apply_lora(model, cfg.model.lora, "CAUSAL_LM")
    load_trainable_state(model, state["actor"])
    out.mkdir(parents=True, exist_ok=True)
    return export_policy(model, tokenizer, out, uses_lora=lora)
