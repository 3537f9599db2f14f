"""Records shared across modules, and their JSONL schema.

`EnvStep` / `Episode` are what any policy produces when it plays an env; the rollout engine
extends them with tokens and log-probs for training.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EnvStep:
    """One action applied to an env and what came back."""

    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    action_is_valid: bool
    action_is_effective: bool
    # Whether an optimal policy could have taken this action (`TextEnv.good_actions`); None
    # when the env did not judge it (no solver, an invalid action, a lost episode).
    action_is_optimal: bool | None = None
    # A tool-calling env's result of the call (`info["tool_result"]`); None for other envs
    # and older records.
    tool_result: str | None = None


@dataclass
class Episode:
    """A whole episode: initial observation, steps, and outcome (one JSONL line)."""

    env_id: str
    seed: int
    policy: str
    initial_observation: str
    steps: list[EnvStep] = field(default_factory=list)
    success: bool = False
    # Success probability an optimal policy has from the initial state (None: no solver).
    optimal_success_prob: float | None = None

    @property
    def total_reward(self) -> float:
        return sum(step.reward for step in self.steps)

    @property
    def num_actions(self) -> int:
        return len(self.steps)

    def to_json(self) -> str:
        record = asdict(self)
        record["total_reward"] = self.total_reward
        record["num_actions"] = self.num_actions
        return json.dumps(record, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Episode:
        return cls.from_dict(json.loads(line))

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Episode:
        """The episode of one parsed JSONL object (`record` itself is left as it is)."""
        fields = dict(record)
        fields.pop("total_reward", None)
        fields.pop("num_actions", None)
        fields["steps"] = [EnvStep(**step) for step in fields.get("steps", [])]
        return cls(**fields)


@dataclass
class Turn:
    """One agent turn of an LLM rollout: what it saw, said and did, and what it earned."""

    state: str  # the env observation the turn started from
    response: str  # the agent's text, including the generation prefix (e.g. "<think>")
    think: str  # parsed reasoning ("" when missing or malformed)
    actions: list[str]  # parsed actions (at most max_actions_per_turn)
    executed: list[str]  # canonical names of the actions the env accepted
    format_ok: bool
    env_reward: float  # sum of the env's step rewards (what is logged)
    reward: float  # env_reward + format_penalty + format_bonus (what is trained on)
    format_penalty: float = 0.0  # negative when the format was broken or an action invalid
    format_bonus: float = 0.0  # optional shaping for a well-formed turn (rollout.format_reward)
    # Counts over the actions attempted: the parsed ones, in order, until the episode's budget
    # of valid actions ran out or the env ended (later ones are not attempted nor judged).
    num_valid: int = 0  # == len(executed); only these use the action budget
    num_effective: int = 0  # valid actions that changed the env state
    num_invalid: int = 0  # rejected by the env (no effect, no budget used, format penalty)
    num_judged: int = 0  # valid actions the env's solver judged (`TextEnv.good_actions`)
    num_optimal: int = 0  # judged actions an optimal policy could have taken
    response_tokens: int = 0
    think_tokens: int = 0
    finish_reason: str = "stop"  # "stop" or "length" (hit the per-turn token budget)
    # Digest of the env's `state_key()` when the turn started: equal digests in one env
    # group = the same env state (GiGPO's anchor states). "" = unknown (older records).
    state_key: str = ""
    # The first turn (1-based) whose state this turn's prompt showed: 1 = the whole dialogue
    # (`EpisodeSettings.context_window`).
    window_start: int = 1
    # A tool-calling env's result of each call attempted (an invalid call's "Error: ..."),
    # in order: what the agent reads in the next turn's `tool` messages.
    tool_results: list[str] = field(default_factory=list)


@dataclass
class Trajectory:
    """A multi-turn LLM episode, token by token, as training needs it.

    `token_ids` is the whole dialogue exactly as the policy saw and produced it; `loss_mask`
    is 1 on the agent's generated tokens only; `logprobs` holds their log-probs under the
    sampling policy (0 elsewhere); `turn_ends` indexes each turn's last generated token.
    """

    env_id: str
    seed: int
    group: int  # rollouts of one group share the seed (the same initial state)
    messages: list[dict[str, str]] = field(default_factory=list)  # OpenAI chat format
    turns: list[Turn] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    # Offsets in `token_ids` where a turn's prompt was built afresh, because its context
    # window (`EpisodeSettings.context_window`) dropped an earlier turn: each part is a
    # sequence of its own (positions restart, no attention across). Empty = one sequence.
    context_resets: list[int] = field(default_factory=list)
    success: bool = False
    done: bool = False  # the env ended the episode (vs. turn/action limits)
    final_state: str = ""  # the env observation after the last turn
    # The env raised or hung (reset or step): the episode ended there, its group is left
    # out of the update, and this says what happened ("step: ValueError: ...").
    error: str | None = None
    # Played through an API (`starpo eval --policy api`): the token counts its replies
    # reported ({"prompt_tokens", "completion_tokens", "requests"}) and the episode's wall
    # seconds. None for in-process rollouts and older records.
    usage: dict[str, int] | None = None
    wall_s: float | None = None
    # Where the episode began when a curriculum started it part-way (the env's reset option
    # "start", a `TextEnv.start_state()` value); None = the seed's own start, the full task.
    start: Any = None
    # A decision task's final answer (`TextEnv.answer()`): the label the agent gave and
    # the one the rules call for; None for tasks without one and older records.
    answer: str | None = None
    gold_answer: str | None = None

    @property
    def reward(self) -> float:
        """Training reward: env rewards plus format penalties."""
        return sum(t.reward for t in self.turns)

    @property
    def env_reward(self) -> float:
        return sum(t.env_reward for t in self.turns)

    @property
    def num_actions(self) -> int:
        return sum(t.num_valid + t.num_invalid for t in self.turns)

    def to_json(self) -> str:
        record = asdict(self)
        record.update(reward=self.reward, env_reward=self.env_reward, num_actions=self.num_actions)
        return json.dumps(record, ensure_ascii=False)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Trajectory:
        """The trajectory of one parsed JSONL object (`record` itself is left as it is)."""
        fields = dict(record)
        for derived in ("reward", "env_reward", "num_actions"):
            fields.pop(derived, None)
        fields["turns"] = [Turn(**turn) for turn in fields.get("turns", [])]
        return cls(**fields)


def by_group(trajectories: Iterable[Trajectory]) -> dict[int, list[Trajectory]]:
    """Trajectories bucketed by `Trajectory.group` (the rollouts of one initial state), in
    ascending group id order, each bucket in input order: the one grouping that the
    StarPO-S filter, its in-group reward std and the Echo-Trap diagnostics share."""
    groups: dict[int, list[Trajectory]] = {}
    for traj in trajectories:
        groups.setdefault(traj.group, []).append(traj)
    return {group: groups[group] for group in sorted(groups)}


#: What `starpo eval` and `starpo train` write, one a line: a scripted policy's episode or
#: a model's trajectory.
Record = Episode | Trajectory


def record_from_dict(record: Mapping[str, Any]) -> Record:
    """One parsed JSONL object as the record it is: a `Trajectory` has 'turns', an
    `Episode` 'steps' (a record with both is a Trajectory). A ValueError when it has
    neither; a malformed record of either kind raises TypeError, KeyError or ValueError.
    """
    if "turns" in record:
        return Trajectory.from_dict(record)
    if "steps" in record:
        return Episode.from_dict(record)
    raise ValueError("it has neither 'turns' (a Trajectory) nor 'steps' (an Episode)")
