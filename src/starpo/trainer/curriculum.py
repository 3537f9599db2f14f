"""Closed-loop pass-rate control (`curriculum.*`): where each step's episodes start.

A group whose rollouts all fail (or all succeed) gives GRPO nothing to learn from; a binary
reward's signal peaks at a pass rate of 1/2. A reverse curriculum starts an episode k moves
before the end of a successful trajectory, where even a weak policy often succeeds, and
the controller moves k after every step:

    k <- clip(k + gain x (pass rate - target), 1, max_moves)

so k grows towards the full task while groups pass more often than the target and shrinks
when they pass less; it settles where the pass rate is the target. Each group draws its own
whole number of moves around k (stochastic rounding, so the mean is k). The agent sees the
start as a fresh first observation: nothing is replayed into its dialogue, so nothing is
trained that it did not write.

Successful trajectories come from the env's solver on the step's fresh seeds
(`source=solver`) or from a buffer of the agent's own successful episodes, replayed
(`source=buffer`). The controller's k and the buffer are part of every checkpoint; a
group's draws come from (run seed, step), so a resumed run plans the same starts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from starpo.config.curriculum import CurriculumConfig
from starpo.envs import make
from starpo.envs.start_states import (
    replay_states,
    solution_states,
    start_before_end,
    supports_start_states,
)
from starpo.errors import UserError
from starpo.stats import mean
from starpo.types import Trajectory


def next_moves(moves: float, pass_rate: float, cfg: CurriculumConfig, top: float) -> float:
    """The controller's step: k + gain x (pass rate - target), kept within [1, top]."""
    return min(top, max(1.0, moves + cfg.gain * (pass_rate - cfg.target)))


def draw_moves(moves: float, rng: np.random.Generator) -> int:
    """A whole number of moves whose mean is `moves`: floor(k) or floor(k) + 1, the latter
    with probability k - floor(k)."""
    low = math.floor(moves)
    return low + int(rng.random() < moves - low)


@dataclass(frozen=True)
class GroupStart:
    """Where one env group starts: its seed, the start state (None: the seed's own start,
    the full task) and the moves before the end it was drawn at (None: a full-task group)."""

    seed: int
    start: Any = None
    moves: int | None = None


@dataclass(frozen=True)
class Success:
    """A successful training episode the buffer keeps: enough to replay it exactly."""

    seed: int
    start: Any
    actions: tuple[str, ...]


class Curriculum:
    """The controller's k, the buffer of successes (source=buffer), and each step's plan."""

    def __init__(
        self, cfg: CurriculumConfig, env_id: str, env_kwargs: dict[str, Any], max_actions: int
    ) -> None:
        self.cfg = cfg
        env = make(env_id, **env_kwargs)
        if not supports_start_states(env):
            raise UserError(
                f"curriculum.enabled needs an env that can start part-way (start_state and "
                f"the reset option 'start'); {env_id} cannot: use frozenlake or sokoban, or "
                "turn the curriculum off"
            )
        if cfg.source == "solver":
            try:
                env.reset(seed=0)
                env.optimal_action()
            except NotImplementedError:
                raise UserError(
                    f"curriculum.source=solver needs an env with a solver; {env_id} has "
                    "none: set curriculum.source=buffer"
                ) from None
        self.env = env
        self.top = float(cfg.max_moves or max_actions)
        self.moves = min(self.top, float(cfg.initial_moves))
        self.buffer: deque[Success] = deque(maxlen=cfg.buffer_size)

    # ------------------------------------------------------------------ planning
    def plan(self, seeds: list[int], rng: np.random.Generator) -> list[GroupStart]:
        """Each group's start this step (one per fresh seed, in order)."""
        full = round(self.cfg.full_task_share * len(seeds))
        plans = []
        for index, seed in enumerate(seeds):
            if index < full:
                plans.append(GroupStart(seed))
            elif self.cfg.source == "solver":
                plans.append(self._part_way(seed, None, None, draw_moves(self.moves, rng)))
            elif self.buffer:
                kept = self.buffer[int(rng.integers(len(self.buffer)))]
                moves = draw_moves(self.moves, rng)
                plans.append(self._part_way(kept.seed, kept.start, kept.actions, moves))
            else:  # an empty buffer: fresh seeds play the full task until one succeeds
                plans.append(GroupStart(seed))
        return plans

    def _part_way(
        self, seed: int, start: Any, actions: tuple[str, ...] | None, moves: int
    ) -> GroupStart:
        """The start `moves` moves before the end of the solver's play (`actions` None) or
        of a kept success; the full task when the trajectory is shorter or cannot be had."""
        if actions is None:
            states = solution_states(self.env, seed)
        else:
            states = replay_states(self.env, seed, start, actions)
        if not states:  # the solver failed on this seed (slips), or the replay diverged
            return GroupStart(seed, start, None)
        part = start_before_end(states, moves)
        if part is None:  # k covers the whole trajectory: where it began
            return GroupStart(seed, start, None)
        return GroupStart(seed, part, moves)

    # ------------------------------------------------------------------ feedback
    def observe(
        self, plans: list[GroupStart], trajectories: list[Trajectory], pass_rate: float
    ) -> dict[str, float]:
        """After the step's rollout: keep its successes (source=buffer), move k by the
        step's pass rate; the step's curriculum metrics (k as it was played)."""
        part_way = [p.moves for p in plans if p.moves is not None]
        metrics = {
            "curriculum/moves": self.moves,
            "curriculum/target": self.cfg.target,
            "curriculum/full_task_groups": 1.0 - len(part_way) / len(plans) if plans else 0.0,
            "curriculum/mean_start_moves": mean(part_way),
        }
        if self.cfg.source == "buffer":
            for trajectory in trajectories:
                if trajectory.success and trajectory.error is None:
                    actions = tuple(a for turn in trajectory.turns for a in turn.executed)
                    self.buffer.append(Success(trajectory.seed, trajectory.start, actions))
            metrics["curriculum/buffer_size"] = len(self.buffer)
        self.moves = next_moves(self.moves, pass_rate, self.cfg, self.top)
        return metrics

    # --------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "moves": self.moves,
            "buffer": [[s.seed, s.start, list(s.actions)] for s in self.buffer],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moves = float(state["moves"])
        self.buffer.clear()
        for seed, start, actions in state["buffer"]:
            self.buffer.append(Success(int(seed), start, tuple(actions)))
