"""Replay records through the rollout engine: the SFT examples are RL rollouts, token for token.

A `ReplayBackend` stands in for the model: each turn it returns the session's next recorded
turn (`starpo.sft.responses`), cut where a real backend with the engine's sampling params
would stop. The engine builds prompts, parses the answers and steps the env exactly as in
RL, so the resulting `Trajectory.token_ids` / `loss_mask` are what RL would train on. Each
replay is then checked against its record (same start, same executed actions, same outcome:
envs are seeded, so a slippery FrozenLake slips again the same way); a record that does not
replay is skipped with a reason, never silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starpo.envs import make
from starpo.envs.policies import has_rationale
from starpo.errors import UserError
from starpo.rollout.backends.base import (
    BackendNumerics,
    Generation,
    GenerationRequest,
    SamplingParams,
    first_stop,
)
from starpo.rollout.engine import EpisodeSettings, RolloutEngine
from starpo.sft.responses import (
    Script,
    check_world_model_think,
    end_of_turn_id,
    episode_script,
    trajectory_script,
    world_model_script,
)
from starpo.types import Episode, Record, Trajectory

#: Records replayed per engine run (bounds the envs held at once; any size replays alike).
REPLAY_CHUNK = 256


def cut_generation(tokens: list[int], params: SamplingParams) -> tuple[Generation, str | None]:
    """What a backend with `params` returns when the model samples `tokens` in order, and
    why that differs from `tokens` (None when the whole turn comes back as recorded)."""
    budget = params.max_new_tokens
    stop = first_stop(tokens[:budget], params)
    if stop is not None:
        end, stop_ids = stop
        kept = list(tokens[:end])
        problem = None if end == len(tokens) else "a turn holds a stop before its end"
        return Generation(kept, [0.0] * end, "stop", stop_ids), problem
    kept = list(tokens[:budget])
    if len(tokens) > budget:
        problem = "a turn is longer than max_new_tokens"
    elif len(tokens) < budget:
        problem = "a turn ends without a stop before max_new_tokens"
    else:
        problem = None
    return Generation(kept, [0.0] * len(kept), "length"), problem


class ReplayBackend:
    """A `GenerationBackend` whose "model" says the recorded turns of each session, once
    (build one per engine run). Log-probs are 0: nothing was sampled."""

    numerics = BackendNumerics("replay", "none", exact_logprobs=False)

    def __init__(self, scripts: list[Script], end_of_turn: int) -> None:
        self.scripts = scripts
        self.end_of_turn = end_of_turn
        self.served = [0] * len(scripts)  # turns handed out per session
        self.problems: dict[int, str] = {}  # session -> first reason its replay differs

    def generate(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        return [self._next(r.session, params) for r in requests]

    def _next(self, session: int, params: SamplingParams) -> Generation:
        turns, index = self.scripts[session], self.served[session]
        self.served[session] += 1
        if index >= len(turns):
            self.problems.setdefault(session, "the episode goes on past the record's last turn")
            return Generation([self.end_of_turn], [0.0], "stop", [self.end_of_turn])
        generation, problem = cut_generation(turns[index], params)
        if problem is not None:
            self.problems.setdefault(session, problem)
        return generation

    # The engine's session bookkeeping: nothing to free; `served` must survive the run.
    def release(self, sessions: Iterable[int]) -> None:
        pass

    def reset(self) -> None:
        pass

    def seed(self, seed: int) -> None:
        pass

    def update_weights(self, model: Any, version: int) -> None:
        pass


def _executed(traj: Trajectory) -> list[list[str]]:
    return [[a.casefold() for a in turn.executed] for turn in traj.turns]


def initial_state(record: Record) -> str | None:
    """The observation the record starts from (None: a trajectory without turns)."""
    if isinstance(record, Episode):
        return record.initial_observation
    return record.turns[0].state if record.turns else None


def mismatch(record: Record, replayed: Trajectory) -> str | None:
    """Why `replayed` is not the episode `record` holds, or None when it is."""
    if isinstance(record, Episode):
        valid = [s.action.casefold() for s in record.steps if s.action_is_valid]
        invalid = sum(not s.action_is_valid for s in record.steps)
        same_actions = [a for t in _executed(replayed) for a in t] == valid and invalid == sum(
            t.num_invalid for t in replayed.turns
        )
        if not all(t.format_ok for t in replayed.turns):
            return "a replayed solver turn does not parse"
    else:
        same_actions = _executed(replayed) == _executed(record)
    if not same_actions:
        return "the executed actions differ from the record"
    if bool(replayed.success) != bool(record.success):
        return "the outcome differs from the record"
    return None


@dataclass
class ReplayResult:
    """SFT examples (replayed trajectories) and why the other records were left out."""

    examples: list[Trajectory] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)  # the record each example comes from
    skipped: Counter[str] = field(default_factory=Counter)


def check_rationales(records: Sequence[Record], settings: EpisodeSettings, env_kwargs) -> None:
    """With think on, scripted episodes need their env's rationales: a UserError if an env
    of theirs has none."""
    if not settings.think:
        return
    for env_id in sorted({r.env_id for r in records if isinstance(r, Episode)}):
        if not has_rationale(make(env_id, **env_kwargs)):
            raise UserError(
                f"env {env_id!r} gives no rationale for its moves (TextEnv.explain), which "
                f"the <think> block of solver data needs; pass --no-think (answers without "
                f"a think block) or implement explain() in the env"
            )


def replay_records(
    records: Sequence[Record],
    tokenizer: Any,
    settings: EpisodeSettings,
    *,
    actions_per_turn: int = 1,
    env_kwargs: dict[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    world_model: bool = False,
) -> ReplayResult:
    """Replay every record (see the module docstring); examples keep the records' order.
    `world_model`: scripted episodes think as a world model (state read back, next state
    predicted: `responses.world_model_script`) instead of with the env's rationales."""
    env_kwargs = dict(env_kwargs or {})
    if actions_per_turn > settings.max_actions_per_turn:
        raise UserError(
            f"--actions-per-turn {actions_per_turn} exceeds --max-actions-per-turn "
            f"{settings.max_actions_per_turn}: the parser would drop actions; lower the first "
            f"or raise the second"
        )
    if world_model:
        check_world_model_think(settings.think)
    else:
        check_rationales(records, settings, env_kwargs)
    engine = RolloutEngine(ReplayBackend([], 0), tokenizer, settings)
    by_env: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        by_env.setdefault(record.env_id, []).append(index)
    replayed: dict[int, Trajectory] = {}
    result = ReplayResult()
    for env_id, indices in by_env.items():
        make(env_id, **env_kwargs)  # an unknown id or argument fails here, before any work
        for first in range(0, len(indices), REPLAY_CHUNK):
            chunk = indices[first : first + REPLAY_CHUNK]
            good, skipped = _replay_chunk(
                engine,
                env_id,
                [records[i] for i in chunk],
                actions_per_turn,
                env_kwargs,
                world_model,
            )
            replayed.update({chunk[i]: t for i, t in good.items()})
            result.skipped.update(skipped)
            if on_progress is not None:
                on_progress(len(chunk))
    result.indices = sorted(replayed)
    result.examples = [replayed[i] for i in result.indices]
    return result


def _replay_chunk(
    engine: RolloutEngine,
    env_id: str,
    records: list[Record],
    actions_per_turn: int,
    env_kwargs: dict[str, Any],
    world_model: bool = False,
) -> tuple[dict[int, Trajectory], Counter[str]]:
    """Replay records of one env in one engine run: ({position: example}, skip reasons)."""
    engine.use_env(make(env_id, **env_kwargs))  # its prefix and turn ends shape the scripts
    skipped: Counter[str] = Counter()
    scripts: dict[int, Script] = {}
    for position, record in enumerate(records):
        if not isinstance(record, Episode):
            script = trajectory_script(engine, record)
        elif world_model:
            script = world_model_script(engine, record, actions_per_turn)
        else:
            script = episode_script(engine, record, actions_per_turn, env_kwargs)
        if isinstance(script, str):
            skipped[script] += 1
        elif len(script) > engine.settings.max_turns:
            skipped[
                "needs more turns than max_turns (raise --max-turns or --actions-per-turn)"
            ] += 1
        elif not script:
            skipped["the record has no turns"] += 1
        else:
            scripts[position] = script
    positions = sorted(scripts)
    if not positions:
        return {}, skipped
    backend = ReplayBackend([scripts[p] for p in positions], end_of_turn_id(engine))
    engine.backend = backend
    seeds = [records[p].seed for p in positions]
    trajectories = engine.run(env_id, seeds, group_size=1, env_kwargs=env_kwargs)
    good = {}
    for session, (position, traj) in enumerate(zip(positions, trajectories, strict=True)):
        problem = _problem(records[position], traj, backend, session)
        if problem is None:
            good[position] = traj
        else:
            skipped[problem] += 1
    return good, skipped


def _problem(record: Record, traj: Trajectory, backend: ReplayBackend, session: int) -> str | None:
    """The first reason the replay of `record` is not the record, most basic first."""
    if traj.turns[0].state != initial_state(record):
        return "the initial state differs (another env or --env-arg?)"
    if session in backend.problems:
        return backend.problems[session]
    if backend.served[session] < len(backend.scripts[session]):
        return "the replay ends before the record (max_turns or max_actions_per_traj?)"
    return mismatch(record, traj)
