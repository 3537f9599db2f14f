"""The training config's `curriculum` section: closed-loop pass-rate control.

A binary reward teaches most where a group succeeds about half the time: a group that always
fails or always succeeds has no variance, so GRPO's baseline cancels it. The curriculum
steers each step's groups towards `curriculum.target` by starting episodes part-way: k moves
before the end of a successful trajectory (the env's solver's, or the agent's own), shown
as a fresh first observation. A controller raises k (towards the full task) while groups pass
more often than the target and lowers it when they pass less. Validation always plays the
full task. See `starpo.trainer.curriculum`.
"""

from __future__ import annotations

from starpo.config.fields import ConfigSection
from starpo.config.fields import config_field as _f


class CurriculumConfig(ConfigSection):
    _prefix = "curriculum"

    enabled: bool = _f(
        False,
        "Steer each step's groups towards curriculum.target pass rate by starting episodes "
        "k moves before the end of a successful trajectory (envs with start states: "
        "frozenlake, sokoban); validation plays the full task.",
    )
    source: str = _f(
        "solver",
        "Where successful trajectories come from: the env's solver, played from each "
        "step's fresh seeds (solver), or the agent's own successful training episodes kept "
        "in a buffer and replayed (buffer; for envs without a solver: groups replay the "
        "buffer's seeds, and fresh seeds play the full task while it is empty).",
        choices=("solver", "buffer"),
    )
    target: float = _f(
        0.5, "Pass rate (mean over groups) the controller steers towards.", gt=0.0, lt=1.0
    )
    gain: float = _f(
        2.0,
        "Moves k changes by per unit of pass-rate error each step: k += gain x (pass rate - "
        "target), so at most gain / 2 moves a step.",
        gt=0.0,
    )
    initial_moves: float = _f(
        1.0, "k at the first step: episodes start this many moves before the end.", ge=1.0
    )
    max_moves: int = _f(
        0,
        "The largest k: at k >= a trajectory's length its group plays the full task; 0 = "
        "rollout.max_actions_per_traj (every group then plays the full task at the top).",
        ge=0,
    )
    full_task_share: float = _f(
        0.0,
        "Share of each step's groups that always play the full task from a fresh seed "
        "(with source=buffer they keep the buffer filling).",
        ge=0.0,
        le=1.0,
    )
    buffer_size: int = _f(
        256, "source=buffer: successful episodes kept (the oldest leave first).", ge=1
    )
