"""Rejection-sampling fine-tuning (RFT): sample episodes from a model, keep the successful
ones, fine-tune the model on them.

One round (`rft_round`): the model plays `samples_per_seed` episodes on each training seed
at its sampling temperature (`starpo.evaluation.model`, the engine `starpo eval` plays
with), the successes are kept, and `run_sft` trains on them. SFT replays a model's
trajectory from its recorded tokens wherever they decode to its reply
(`responses.trajectory_script`), so what is trained is the model's own reply, token for
token, never a re-tokenised or edited text. Between SFT and RL this gives the RL stage a
start that leans towards the moves that worked, where RL from SFT alone may see groups
whose rewards are all equal (a tool agent's GRPO from SFT stalled at ~2% that way; SFT ->
RFT -> GRPO took its pass@4 from 14.3 to 59.0).

A round that keeps nothing leaves the model as it was (nothing to learn from); its record
says so, and the next stage starts from the model it sampled. A round run again into the
same folder (a resume after a crash in fine-tuning) reuses the samples it drew when it
drew them from the same model with the same seeds and settings (`kept_samples`): sampling
is most of a round's time (15-36 minutes on a 2-core CPU for 1,024 FrozenLake episodes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starpo.config.episode import EpisodeSettings
from starpo.errors import UserError
from starpo.evaluation.summary import write_results
from starpo.sft.data import validation_seeds
from starpo.types import Trajectory, record_from_dict

if TYPE_CHECKING:
    from starpo.sft.options import TrainOptions

#: Where a round keeps every episode it sampled (`starpo eval`'s files: viewable, and
#: scored by `experiments/world_model_accuracy.py`).
SAMPLES_DIR = "samples"
#: Beside the samples: what they were drawn with (`sampling_key`).
SAMPLED_FILE = "sampled.json"


def keep_successes(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The episodes to learn from: successful, and not cut short by a broken env (whose
    outcome is not the policy's)."""
    return [t for t in trajectories if t.success and t.error is None]


def check_training_seeds(seeds: range) -> range:
    """`seeds` when none is a validation seed; a one-line UserError otherwise (RFT would
    then train on the very states its evaluation scores)."""
    val = validation_seeds()
    if seeds.start < val.stop and val.start < seeds.stop:
        raise UserError(
            f"RFT seeds {seeds.start}..{seeds.stop - 1} overlap the validation seeds "
            f"{val.start}..{val.stop - 1}; sample on training seeds (e.g. from 100000)"
        )
    return seeds


def sample_episodes(
    model: str,
    env_id: str,
    seeds: range,
    samples_per_seed: int,
    settings: EpisodeSettings,
    *,
    env_kwargs: dict[str, Any],
    device: str,
    backend: str,
    dtype: str,
    batch_size: int,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """`model`'s episodes, `samples_per_seed` a seed, with `settings` (their temperature:
    the sampling one), and their summary."""
    from starpo.evaluation.model import evaluate_model

    result, summary = evaluate_model(
        env_id,
        model,
        list(seeds),
        settings,
        samples_per_seed=samples_per_seed,
        batch_size=batch_size,
        device=device,
        backend=backend,
        dtype=dtype,
        seed=seeds.start,
        env_kwargs=env_kwargs,
    )
    return result.trajectories, summary


def sampling_key(
    model: str,
    env_id: str,
    seeds: range,
    samples_per_seed: int,
    settings: EpisodeSettings,
    env_kwargs: dict[str, Any],
) -> dict[str, Any]:
    """What decides a round's samples, as JSON: the model (its path, and its weights' size
    and modification time, so a model trained again in the same folder samples afresh),
    env, seeds, samples a seed and the episode settings."""
    weights = sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
    stamps = [[w.name, w.stat().st_size, w.stat().st_mtime_ns] for w in weights]
    return {
        "model": model,
        "weights": stamps,
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "seeds": [seeds.start, seeds.stop],
        "samples_per_seed": samples_per_seed,
        "settings": settings.model_dump(mode="json"),
    }


def kept_samples(folder: Path, key: dict[str, Any]) -> list[Trajectory] | None:
    """The samples in `folder` when they were drawn with `key` and read back whole, else
    None (none kept, other settings, or a file cut short by a crash: sample again)."""
    try:
        if json.loads((folder / SAMPLED_FILE).read_text(encoding="utf-8")) != key:
            return None
        lines = (folder / "trajectories.jsonl").read_text(encoding="utf-8").splitlines()
        samples = [record_from_dict(json.loads(line)) for line in lines]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    wanted = (key["seeds"][1] - key["seeds"][0]) * key["samples_per_seed"]
    whole = len(samples) == wanted and all(isinstance(t, Trajectory) for t in samples)
    return samples if whole else None  # type: ignore[return-value]


def rft_round(
    model: str,
    out: Path,
    env_id: str,
    settings: EpisodeSettings,
    *,
    seeds: range,
    samples_per_seed: int,
    options: TrainOptions,
    env_kwargs: dict[str, Any] | None = None,
    device: str = "cpu",
    backend: str = "auto",
    dtype: str = "auto",
    batch_size: int = 64,
    quiet: bool = True,
) -> dict[str, Any]:
    """One round (module docstring) from `model` into `out`: its samples under
    `out/samples/`, and the fine-tuned model in `out` when any episode succeeded. Returns
    the round's record: what was sampled and kept, and `model`, the model the round ends
    with (`out`, or `model` itself when nothing was kept)."""
    from starpo.sft.run import run_sft

    env_kwargs = dict(env_kwargs or {})
    check_training_seeds(seeds)
    key = sampling_key(model, env_id, seeds, samples_per_seed, settings, env_kwargs)
    sampled = kept_samples(out / SAMPLES_DIR, key)
    if sampled is None:
        sampled, summary = sample_episodes(
            model,
            env_id,
            seeds,
            samples_per_seed,
            settings,
            env_kwargs=env_kwargs,
            device=device,
            backend=backend,
            dtype=dtype,
            batch_size=batch_size,
        )
        write_results(out / SAMPLES_DIR, sampled, summary)
        text = json.dumps(key, indent=2) + "\n"  # written last: the samples are whole
        (out / SAMPLES_DIR / SAMPLED_FILE).write_text(text, encoding="utf-8")
    elif not quiet:
        print(f"RFT: {len(sampled)} episodes sampled before, reused: {out / SAMPLES_DIR}")
    kept = keep_successes(sampled)
    record: dict[str, Any] = {
        "sampled_from": model,
        "seeds": [seeds.start, seeds.stop - 1],
        "samples_per_seed": samples_per_seed,
        "sampled": len(sampled),
        "kept": len(kept),
        "kept_share": len(kept) / len(sampled) if sampled else 0.0,
        "seeds_with_a_success": len({t.seed for t in kept}),
    }
    if not kept:
        return {**record, "model": model, "trained": False}
    sft = run_sft(
        model,
        kept,
        settings,
        out,
        options=options,
        only_success=True,
        env_id=env_id,
        env_kwargs=env_kwargs,
        device=device,
        quiet=quiet,
    )
    return {**record, "model": str(out), "trained": True, "epochs": sft["epochs"],
            "data": sft["data"]}  # fmt: skip
