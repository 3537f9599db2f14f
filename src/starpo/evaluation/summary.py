"""The one summary of episodes of any policy, and the folder it is written to.

`summarise` is the one summary of episodes: `starpo eval` writes it for scripted policies
and LLMs alike, and the trainer logs it for training and validation rollouts.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starpo import runs
from starpo.envs.base import NO_ANSWER
from starpo.stats import mean, pass_at_k, ratio, wilson_interval
from starpo.types import Episode, Record, Trajectory


def _action_counts(episode: Record) -> tuple[int, int, int, int, int]:
    """(valid, invalid, effective, judged, optimal) actions of one episode of either kind
    (judged: valid actions the env's solver judged; optimal: those it counted as optimal)."""
    if isinstance(episode, Episode):
        steps = episode.steps
        valid = sum(s.action_is_valid for s in steps)
        judged = [s.action_is_optimal for s in steps if s.action_is_optimal is not None]
        effective = sum(s.action_is_effective for s in steps)
        return valid, len(steps) - valid, effective, len(judged), sum(judged)
    turns = episode.turns
    return (
        sum(t.num_valid for t in turns),
        sum(t.num_invalid for t in turns),
        sum(t.num_effective for t in turns),
        sum(t.num_judged for t in turns),
        sum(t.num_optimal for t in turns),
    )


def _pass_at_ks(episodes: Sequence[Record]) -> dict[str, float]:
    """`pass@k` for k = 1, 2, 4, ... up to the fewest samples any seed has, averaged over
    seeds (k = that number too)."""
    by_seed: dict[int, list[bool]] = defaultdict(list)
    for e in episodes:
        by_seed[e.seed].append(e.success)
    n = min((len(v) for v in by_seed.values()), default=0)
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, n) if 1 <= k <= n})
    return {f"pass@{k}": mean([pass_at_k(len(v), sum(v), k) for v in by_seed.values()]) for k in ks}


def _turn_summary(
    trajectories: list[Trajectory], generation_seconds: float | None
) -> dict[str, float]:
    """What only an LLM's episodes have: training reward, format, turns, token counts."""
    turns = [turn for t in trajectories for turn in t.turns]
    generated = sum(turn.response_tokens for turn in turns)
    out = {
        "train_reward": mean([t.reward for t in trajectories]),
        "format_ok": mean([float(turn.format_ok) for turn in turns]),
        "num_turns": mean([len(t.turns) for t in trajectories]),
        "mean_response_tokens": mean([turn.response_tokens for turn in turns]),
        "mean_think_tokens": mean([turn.think_tokens for turn in turns]),
        "generated_tokens": generated,
        # episodes an env error ended (raised or hung; see EpisodeSettings.env_timeout_s)
        "env_errors": sum(t.error is not None for t in trajectories),
    }
    if generation_seconds is not None:
        out["generation_tokens_per_s"] = ratio(generated, generation_seconds)
    if any(turn.tool_results for turn in turns):
        out.update(_tool_summary(turns))
    if any(t.gold_answer is not None for t in trajectories):
        out.update(_answer_summary(trajectories))
    return out


def _tool_summary(turns: list[Any]) -> dict[str, float]:
    """A tool-calling env's calls: the share well formed (`tool_call_valid`: a JSON object
    naming a tool, with arguments its schema accepts) and each tool's count of those."""
    tried = sum(turn.num_valid + turn.num_invalid for turn in turns)
    counts: dict[str, int] = defaultdict(int)
    for turn in turns:
        for call in turn.executed:
            counts[json.loads(call).get("name", "?")] += 1
    per_tool = {f"tool_calls/{name}": float(n) for name, n in sorted(counts.items())}
    return {"tool_call_valid": ratio(sum(counts.values()), tried), **per_tool}


def answer_overuse(answers: Sequence[str], golds: Sequence[str]) -> float | None:
    """How far one answer took over cases it is wrong for: the largest, over the labels
    given (NO_ANSWER aside), share of the cases whose gold label differs that got it.
    0 when every given answer is right; 1 when one label went to every case of other
    kinds, as when RL drove an invoice agent's line checks onto "price_mismatch". None
    when no given label has a case it would be wrong for."""
    shares = []
    for label in set(answers) - {NO_ANSWER}:
        others = [given for given, gold in zip(answers, golds, strict=True) if gold != label]
        if others:
            shares.append(others.count(label) / len(others))
    return max(shares) if shares else None


def _answer_summary(trajectories: list[Trajectory]) -> dict[str, float]:
    """A decision task's answers (`TextEnv.answer()`): answer_share/<label> (the share of
    episodes that gave it), family_success/<gold label> (success among the cases that
    call for it) and answer_overuse."""
    decided = [t for t in trajectories if t.gold_answer is not None]
    answers = [t.answer or NO_ANSWER for t in decided]
    golds = [str(t.gold_answer) for t in decided]
    out: dict[str, float] = {
        f"answer_share/{label}": answers.count(label) / len(answers)
        for label in sorted(set(answers))
    }
    for gold in sorted(set(golds)):
        family = [t.success for t in decided if t.gold_answer == gold]
        out[f"family_success/{gold}"] = ratio(sum(family), len(family))
    overuse = answer_overuse(answers, golds)
    if overuse is not None:
        out["answer_overuse"] = overuse
    return out


def summarise(
    episodes: Sequence[Record], *, generation_seconds: float | None = None
) -> dict[str, Any]:
    """The one summary of a set of episodes, a scripted policy's or an LLM's.

    Keys (the names `starpo eval` writes to summary.json and the trainer logs under
    `train/<env>/` and `val/<env>/`):
    num_episodes; success with its 95% Wilson interval success_ci95_low/high; pass@k per
    seed; reward (the env's, per episode); num_actions (per episode); valid_action_rate
    (valid / tried); effective_action_rate (state-changing / valid); where the env judges
    moves (`TextEnv.good_actions`: Bandit, Sokoban, FrozenLake), optimal_action_rate
    (actions an optimal policy could have taken / judged ones). Scripted episodes add
    optimal_success (mean optimal success probability; None without a solver). LLM
    trajectories add train_reward (with format penalties), format_ok (share of turns),
    num_turns, mean_response_tokens and mean_think_tokens (per turn), generated_tokens,
    env_errors (episodes an env error ended), and with `generation_seconds` (time in the
    generation backend) generation_tokens_per_s. Tool-calling envs add tool_call_valid
    (well-formed calls / calls) and tool_calls/<tool> (well-formed calls of each tool).
    Decision tasks (`TextEnv.answer()`: invoice, support) add answer_share/<label>,
    family_success/<gold label> and answer_overuse (see `answer_overuse`).
    """
    n = len(episodes)
    successes = sum(e.success for e in episodes)
    low, high = wilson_interval(successes, n)
    counts = [_action_counts(e) for e in episodes]
    valid, invalid, effective, judged, optimal = (sum(c[i] for c in counts) for i in range(5))
    rewards = [e.total_reward if isinstance(e, Episode) else e.env_reward for e in episodes]
    summary: dict[str, Any] = {
        "num_episodes": n,
        "success": ratio(successes, n),
        "success_ci95_low": low,
        "success_ci95_high": high,
        **_pass_at_ks(episodes),
        "reward": mean(rewards),
        "num_actions": mean([e.num_actions for e in episodes]),
        "valid_action_rate": ratio(valid, valid + invalid),
        "effective_action_rate": ratio(effective, valid),
    }
    if judged:  # only envs with `good_actions` judge moves
        summary["optimal_action_rate"] = ratio(optimal, judged)
    scripted = [e for e in episodes if isinstance(e, Episode)]
    if scripted:
        optimal = [e.optimal_success_prob for e in scripted if e.optimal_success_prob is not None]
        summary["optimal_success"] = mean(optimal) if optimal else None
    trajectories = [e for e in episodes if isinstance(e, Trajectory)]
    if trajectories:
        summary.update(_turn_summary(trajectories, generation_seconds))
    return summary


def write_results(out_dir: Path, episodes: Sequence[Record], summary: dict[str, Any]) -> None:
    """`out_dir/trajectories.jsonl` (one episode a line) and `out_dir/summary.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / runs.EVAL_TRAJECTORIES_FILE, "w", encoding="utf-8") as f:
        for episode in episodes:
            f.write(episode.to_json() + "\n")
    summary_text = json.dumps(summary, indent=2) + "\n"
    (out_dir / runs.SUMMARY_FILE).write_text(summary_text, encoding="utf-8")
