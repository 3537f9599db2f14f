"""The world-model turn (SPA, arXiv 2510.15047) and its measure: how often a reply reads
the state back and predicts the next one exactly.

A world-model turn's think block holds two fields, in this order:
`<observation>{the state as the env renders it}</observation> <prediction>{the state the
env renders after the turn's actions}</prediction>`. `starpo sft --from-world-model`
writes them from the random policy's transitions (`starpo.sft.responses`); this module
owns the layout (one place for the tags) and reads them back from a reply, so a model's
`trajectories.jsonl` (`starpo eval --out`, before or after RL) scores its world model
with no new playing code: each turn's state is recorded, and the state after it is the
next turn's (or the episode's final state).

Torch-free: it reads records only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from starpo.types import Trajectory

OBSERVATION, PREDICTION = "observation", "prediction"


def world_model_rationale(before: str, after: str) -> str:
    """The think block's text of a world-model turn: the state read back, then the state
    predicted after the turn's actions (both as the env renders them)."""
    return f"<{OBSERVATION}>{before}</{OBSERVATION}> <{PREDICTION}>{after}</{PREDICTION}>"


def tagged(reply: str, tag: str) -> str | None:
    """The text inside the first `<tag>...</tag>` of `reply`, or None when the tag is
    missing, unclosed, or opened again before it closes (a reply that lost its structure
    predicts nothing, rather than a lucky substring)."""
    match = re.search(rf"<{tag}>(.*?)</{tag}>", reply, re.DOTALL)
    if match is None or f"<{tag}>" in match.group(1):
        return None
    return match.group(1)


def normalise_state(text: str) -> str:
    """`text` with each line's whitespace runs made one space, lines stripped and blank ones
    dropped: a grid's rows must match, not the spacing around them (a model writing
    `_ P` for `_ P ` is right; one writing two rows on one line is not)."""
    lines = (" ".join(line.split()) for line in text.strip().splitlines())
    return "\n".join(line for line in lines if line)


def field_matches(reply: str, tag: str, state: str) -> bool:
    """Whether `reply`'s `<tag>` field is `state` up to whitespace (`normalise_state`);
    False when the field is missing or malformed."""
    written = tagged(reply, tag)
    return written is not None and normalise_state(written) == normalise_state(state)


def states_after(traj: Trajectory) -> list[str]:
    """The state the env showed after each turn: the next turn's starting state, and the
    episode's final state after the last turn."""
    return [turn.state for turn in traj.turns[1:]] + [traj.final_state]


@dataclass
class WorldModelScore:
    """Counts over turns: fields written at all, and written exactly right."""

    turns: int = 0
    observations: int = 0  # turns with a well-formed <observation> field
    predictions: int = 0  # ... and <prediction> field
    observation_exact: int = 0  # the field equals the turn's state
    prediction_exact: int = 0  # the field equals the state after the turn

    def rates(self) -> dict[str, float | int]:
        """Shares over all turns (a turn without the field counts as wrong)."""
        share = (lambda n: n / self.turns) if self.turns else (lambda n: 0.0)
        return {
            "turns": self.turns,
            "prediction_exact": share(self.prediction_exact),
            "observation_exact": share(self.observation_exact),
            "prediction_written": share(self.predictions),
            "observation_written": share(self.observations),
        }


def score_trajectories(trajectories: Iterable[Trajectory]) -> WorldModelScore:
    """Every turn of `trajectories` scored against the states the env showed. An episode
    the env broke (`Trajectory.error`) is left out: its last state is not the env's."""
    score = WorldModelScore()
    for traj in trajectories:
        if traj.error is not None:
            continue
        for turn, after in zip(traj.turns, states_after(traj), strict=True):
            score.turns += 1
            score.observations += tagged(turn.response, OBSERVATION) is not None
            score.predictions += tagged(turn.response, PREDICTION) is not None
            score.observation_exact += field_matches(turn.response, OBSERVATION, turn.state)
            score.prediction_exact += field_matches(turn.response, PREDICTION, after)
    return score
