"""What a training checkpoint holds and how the trainable state comes back from one: the
trainable weights (frozen ones and the reference model are rebuilt from model.name),
AdamW's moments and the schedules, RNG, config, diagnostics and trainer counters. Saving
(atomic folders, async writes, pruning) is `starpo.trainer.checkpoints.saver`; reading and finding
checkpoints is `starpo.trainer.checkpoints.store`."""

from __future__ import annotations

from typing import Any

from starpo.compute.weights import load_trainable_state, trainable_state
from starpo.config import TrainConfig, config_to_dict
from starpo.logs import warn
from starpo.trainer.budget import STATE_KEY
from starpo.trainer.checkpoints.saver import OPTIMIZER_KEYS
from starpo.trainer.checkpoints.store import capture_rng_state
from starpo.trainer.optim import Optimizers
from starpo.trainer.train_models import TrainModels


def checkpoint_contents(
    step: int,
    cfg: TrainConfig,
    models: TrainModels,
    optimizers: Optimizers,
    *,
    guard: dict[str, Any],
    memory: dict[str, Any],
    consecutive_skips: int,
    used_minutes: float,
    curriculum: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The state a checkpoint of `step` holds (no AdamW moments with
    trainer.checkpoint_contents=weights). `guard`: `CollapseGuard.state_dict()`; `memory`:
    the Echo-Trap response memory's state; `curriculum`: the pass-rate controller's k and
    buffer (`Curriculum.state_dict()`, None without one). Live tensors and objects, not copies: a
    synchronous save writes them before the next update, an async one snapshots them."""
    critic = models.critic
    state = {
        "step": step,
        "contents": cfg.trainer.checkpoint_contents,
        "actor": trainable_state(models.actor, copy=False),
        "critic": trainable_state(critic, copy=False) if critic is not None else None,
        **optimizers.state_dict(),  # optimizers and learning-rate schedules
        "rng": capture_rng_state(),
        "config": config_to_dict(cfg),
        "diagnostics": {
            "detector": guard["detector"],
            "memory": memory,
            "rollbacks": guard["rollbacks"],
        },
        "trainer_state": {
            "runtime_config": guard["runtime_config"],  # changed by a rollback
            "consecutive_skips": consecutive_skips,
            STATE_KEY: used_minutes,  # trainer.max_minutes counts across resumes
            "curriculum": curriculum,
        },
    }
    if cfg.trainer.checkpoint_contents == "weights":
        state.update(dict.fromkeys(OPTIMIZER_KEYS))
    return state


def restore_training_state(
    models: TrainModels, optimizers: Optimizers, state: dict[str, Any], schedules: bool = True
) -> None:
    """Trainable weights and optimizer state (and the schedules) from a checkpoint's state.

    A weights-only checkpoint (trainer.checkpoint_contents=weights) restarts AdamW's
    moments, with one warning: the run no longer repeats an unbroken one."""
    load_trainable_state(models.actor, state["actor"])
    if models.critic is not None:
        load_trainable_state(models.critic, state["critic"])
    if state.get("actor_optim") is None:
        warn(
            f"the checkpoint of step {state['step']} holds weights only "
            "(trainer.checkpoint_contents=weights): AdamW's moments restart from zero, "
            "so this run will not repeat an unbroken one",
            "starpo.trainer",
        )
    optimizers.load_state_dict(state, schedules=schedules)
