"""Records -> the tokens the policy must generate in each turn to reproduce them.

The replay (`starpo.sft.replay`) feeds these tokens to the rollout engine as if a model had
sampled them, so an SFT example is laid out exactly as an RL rollout: same prompts, same
chunks between turns, same end of turn. Where a turn ends follows the engine's settings,
as a real generation would:
- `stop_at_answer` on: the backend stops at the stop sequence `</answer>` (or ` </answer>`;
  a tool env's turn of one call at `</tool_call>`), so the turn's tokens end with that
  sequence's own tokens and the template's end of turn (`<|im_end|>\\n`) comes in the next
  fed-in chunk;
- otherwise the model ends its turn itself with the template's end-of-turn token
  (`<|im_end|>`), which is generated (and trained on), and the next chunk starts after it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starpo.envs import make
from starpo.envs.tools import call_text
from starpo.errors import UserError
from starpo.evaluation.world_model import world_model_rationale
from starpo.rollout.engine import RolloutEngine
from starpo.rollout.parser import ACTION_SEPARATOR, TAGGED
from starpo.types import Episode, Trajectory

#: Turns of one record as generated token ids, or the reason it cannot be replayed.
Script = list[list[int]]


def end_of_turn_id(engine: RolloutEngine) -> int:
    """The stop token that opens the chat template's end of an assistant turn (`<|im_end|>`
    for ChatML): what a model emits to end its turn when generation is not cut at
    `</answer>`, and what the engine then strips from the next chunk."""
    stops = engine.params.stop_token_ids
    end = engine.chat.pieces.assistant_end
    for token in stops:
        text = engine.tokenizer.decode([token])
        if text and end.startswith(text):
            return token
    if not stops:
        raise UserError("the tokenizer has no end-of-turn or eos token; use a chat model")
    return stops[0]


def response_tokens(engine: RolloutEngine, text: str, finish_reason: str = "stop") -> list[int]:
    """Tokens a model generates for a turn whose text after the generation prefix is `text`
    (see the module docstring for how it ends). A turn cut by the token budget
    (`finish_reason` "length") ends where its text ends."""
    encode = engine.chat.encode
    if finish_reason == "length":
        return encode(text)
    if engine.stop_texts:
        # The longest close first: " </answer>" is one stop sequence, "</answer>" another.
        for close in sorted(engine.stop_texts, key=len, reverse=True):
            if text.endswith(close):
                return encode(text[: -len(close)]) + encode(close)
    return encode(text) + [end_of_turn_id(engine)]


def solver_turn_text(
    actions: Sequence[str], rationale: str | None, think: bool, call_syntax: str | None = None
) -> str:
    """A solver turn's text after the generation prefix, in the prompt's own layout
    ("<think> [Your thoughts] </think> <answer> [your answer] </answer>"): with think on
    ` {rationale} </think> <answer> A1 || A2 </answer>` after `<think>`, without
    ` A1 || A2 </answer>` after `<answer>`. A tool-calling env's actions are calls (their
    canonical JSON texts), written in `call_syntax`: ` {rationale} </think>
    <tool_call>{...}</tool_call>` (TAGGED; without think: from `<tool_call>`) or
    ` {rationale} </think> {"name": ..., "parameters": {...}}` (BARE_JSON, one call)."""
    if call_syntax is not None:
        calls = " ".join(written_call(call, call_syntax) for call in actions)
        return f" {rationale} </think> {calls}" if think else calls
    answer = f" {f' {ACTION_SEPARATOR} '.join(actions)} </answer>"
    return f" {rationale} </think> <answer>{answer}" if think else answer


def written_call(call: str, syntax: str) -> str:
    """A call's canonical text (`{"name": ..., "arguments": ...}`) as `syntax` writes it."""
    if syntax == TAGGED:
        return f"<tool_call>{call}</tool_call>"
    parsed = json.loads(call)
    return call_text(parsed["name"], parsed["arguments"], key="parameters")


def rationales(episode: Episode, env_kwargs: dict[str, Any]) -> list[str | None]:
    """The env's `explain(action)` for each step, from the state before that step: the env
    is replayed from the record's seed (seeded, so a slippery env slips as recorded)."""
    env = make(episode.env_id, **env_kwargs)
    env.reset(seed=episode.seed)
    explain = getattr(env, "explain", None)
    out: list[str | None] = []
    for step in episode.steps:
        out.append(explain(step.action) if callable(explain) and not env.done else None)
        if not env.done:
            env.step(step.action)
    return out


def episode_script(
    engine: RolloutEngine, episode: Episode, actions_per_turn: int, env_kwargs: dict[str, Any]
) -> Script | str:
    """A scripted policy's episode as turns of up to `actions_per_turn` actions, each turn
    with the env's rationales for its actions when thinking is on."""
    think = engine.settings.think
    # The replay set the engine to its env: a tool env's calls in the template's syntax.
    syntax = engine.call_syntax if engine.tool_schemas is not None else None
    reasons = rationales(episode, env_kwargs) if think else [None] * len(episode.steps)
    if think and any(r is None for r in reasons):
        return "the env gives no rationale for a move (not the solver's?)"
    actions = [step.action for step in episode.steps]
    script = []
    for first in range(0, len(actions), actions_per_turn):
        chunk = slice(first, first + actions_per_turn)
        rationale = " ".join(r for r in reasons[chunk] if r) if think else None
        text = solver_turn_text(actions[chunk], rationale, think, syntax)
        script.append(response_tokens(engine, text))
    return script


def check_world_model_think(think: bool) -> None:
    """A world-model turn states the current and the next state inside its think block:
    a one-line UserError when thinking is off."""
    if not think:
        raise UserError(
            "world-model SFT writes the state and its predicted successor in the <think> "
            "block: turn thinking on (starpo sft: --think; a config or starpo demo: "
            "rollout.think=true)"
        )


def world_model_script(
    engine: RolloutEngine, episode: Episode, actions_per_turn: int
) -> Script | str:
    """A scripted policy's episode as world-model turns (SPA): turns of up to
    `actions_per_turn` actions whose think block reads back the state the turn starts from
    and predicts the state after its last action, both as the episode recorded them
    (`starpo.evaluation.world_model`); the actions are the policy's own. Thinking must be
    on: `replay_records` checks it once (`check_world_model_think`)."""
    syntax = engine.call_syntax if engine.tool_schemas is not None else None
    states = [episode.initial_observation, *(step.observation for step in episode.steps)]
    actions = [step.action for step in episode.steps]
    script = []
    for first in range(0, len(actions), actions_per_turn):
        last = min(first + actions_per_turn, len(actions))
        rationale = world_model_rationale(states[first], states[last])
        text = solver_turn_text(actions[first:last], rationale, True, syntax)
        script.append(response_tokens(engine, text))
    return script


def recorded_turn_tokens(traj: Trajectory) -> list[list[int]] | None:
    """Each turn's generated tokens as recorded (the run of loss-masked tokens that ends at
    its `turn_ends` entry), or None when the record's tokens are missing or inconsistent."""
    ids, mask, ends = traj.token_ids, traj.loss_mask, traj.turn_ends
    if len(ends) != len(traj.turns) or len(mask) != len(ids):
        return None
    turns, previous = [], -1
    for end in ends:
        if not previous < end < len(ids) or mask[end] != 1:
            return None
        start = end
        while start - 1 > previous and mask[start - 1] == 1:
            start -= 1
        turns.append(ids[start : end + 1])
        previous = end
    return turns


def trajectory_script(engine: RolloutEngine, traj: Trajectory) -> Script | str:
    """A model's turns: its recorded tokens where they decode to the recorded response under
    this tokenizer (exactly what it sampled), else its response text re-tokenised."""
    prefix = engine.prefix
    recorded = recorded_turn_tokens(traj) or [None] * len(traj.turns)
    script = []
    for turn, tokens in zip(traj.turns, recorded, strict=True):
        if tokens and prefix + engine.tokenizer.decode(tokens, skip_special_tokens=True) == (
            turn.response
        ):
            script.append(list(tokens))
        elif not turn.response.startswith(prefix):
            return f"a response does not start with the generation prefix {prefix} (--think?)"
        else:
            text = turn.response[len(prefix) :]
            script.append(response_tokens(engine, text, turn.finish_reason))
    return script
