"""Per-step metrics that diagnose the Echo Trap (RAGEN's name for StarPO's collapse).

Collapse shows first as falling in-group reward spread and entropy, then shrinking
reasoning and repetitive outputs (REFERENCE.md). `echo_trap_metrics` turns one step's
trajectories into flat `diagnostics/...` floats for the sinks and for `CollapseDetector`.

Conventions (all nan-safe: no nan or inf is ever returned):
- No trajectories -> `{}` (nothing to log this step).
- A ratio whose denominator is zero is 0.0 (e.g. effectiveness with no valid action).
- "Response" means one turn's `Turn.response` text; "tokens" for distinct-n are its
  whitespace-separated words, while lengths use the tokenizer counts on `Turn`.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Container, Iterable, Iterator

from starpo.types import Trajectory, Turn

PREFIX = "diagnostics"


def _ratio(num: float, den: float) -> float:
    """num / den, or 0.0 when den is 0 (documented convention of this module)."""
    return float(num) / float(den) if den else 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def group_by_id(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    """Trajectories bucketed by `Trajectory.group`, buckets in ascending group id order."""
    groups: dict[int, list[Trajectory]] = {}
    for traj in trajectories:
        groups.setdefault(traj.group, []).append(traj)
    return [groups[g] for g in sorted(groups)]


def sample_std(values: list[float]) -> float:
    """Unbiased std (Bessel's correction, as the trainer's filtering uses); 0.0 for n < 2."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def ngrams(words: list[str], n: int) -> list[tuple[str, ...]]:
    """Contiguous n-grams of one response (never spanning two responses)."""
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def distinct_n(texts: list[str], n: int) -> float | None:
    """distinct-n = |unique n-grams| / |n-grams| pooled over `texts`; None when no n-gram.

    Identical texts pool to about 1 / len(texts), varied texts approach 1.
    """
    grams = [g for text in texts for g in ngrams(text.split(), n)]
    return len(set(grams)) / len(grams) if grams else None


def duplicate_count(texts: list[str]) -> int:
    """How many of `texts` equal at least one other text in the list."""
    counts = Counter(texts)
    return sum(c for c in counts.values() if c > 1)


def _turns(trajectories: Iterable[Trajectory]) -> list[Turn]:
    return [turn for traj in trajectories for turn in traj.turns]


def reward_spread_metrics(groups: list[list[Trajectory]]) -> dict[str, float]:
    """In-group std of `Trajectory.reward`, its mean over groups, and zero-std groups.

    A group is "zero-std" when its std is below 1e-8 (a single rollout counts as zero-std:
    it gives GRPO no learning signal either).
    """
    stds = [sample_std([t.reward for t in group]) for group in groups]
    return {
        f"{PREFIX}/reward_std": _mean(stds),
        f"{PREFIX}/zero_std_groups": _ratio(sum(s < 1e-8 for s in stds), len(stds)),
    }


def length_metrics(turns: list[Turn]) -> dict[str, float]:
    """Mean response and think length (tokens) per turn, and the empty-think shares.

    `empty_think` counts every turn whose `think == ""`, malformed turns included (their
    think is "" by construction: the policy produced no usable reasoning either way);
    `empty_think_ok` restricts to well-formed turns (`format_ok`), so it separates
    "stopped reasoning" from "broke the format". With thinking disabled both are 1.0.
    """
    ok = [t for t in turns if t.format_ok]
    return {
        f"{PREFIX}/response_length": _mean([float(t.response_tokens) for t in turns]),
        f"{PREFIX}/think_length": _mean([float(t.think_tokens) for t in turns]),
        f"{PREFIX}/empty_think": _ratio(sum(t.think == "" for t in turns), len(turns)),
        f"{PREFIX}/empty_think_ok": _ratio(sum(t.think == "" for t in ok), len(ok)),
    }


def diversity_metrics(
    groups: list[list[Trajectory]], previous: Container[str] | None
) -> dict[str, float]:
    """Output diversity from the responses of all turns, pooled per group.

    - `distinct_1` / `distinct_2`: distinct-n within each group, averaged over the groups
      that have at least one n-gram (0.0 when none has).
    - `identical_in_group`: share of responses equal to another response of the same group
      (an exact repeat across rollouts or turns from the same initial state).
    - `seen_before`: share of responses found in `previous` (earlier steps' responses);
      0.0 when `previous` is None.
    """
    out: dict[str, float] = {}
    texts_by_group = [[turn.response for turn in _turns(group)] for group in groups]
    for n in (1, 2):
        values = [distinct_n(texts, n) for texts in texts_by_group]
        out[f"{PREFIX}/distinct_{n}"] = _mean([v for v in values if v is not None])
    total = sum(len(texts) for texts in texts_by_group)
    duplicates = sum(duplicate_count(texts) for texts in texts_by_group)
    out[f"{PREFIX}/identical_in_group"] = _ratio(duplicates, total)
    seen = 0
    if previous is not None:
        seen = sum(text in previous for texts in texts_by_group for text in texts)
    out[f"{PREFIX}/seen_before"] = _ratio(seen, total)
    return out


def action_metrics(turns: list[Turn]) -> dict[str, float]:
    """Format-valid rate per turn, action validity and effectiveness.

    validity = valid / (valid + invalid); effectiveness = effective / valid (an effective
    action changed the env state); each 0.0 when its denominator is 0.
    """
    valid = sum(t.num_valid for t in turns)
    invalid = sum(t.num_invalid for t in turns)
    effective = sum(t.num_effective for t in turns)
    return {
        f"{PREFIX}/format_ok": _ratio(sum(t.format_ok for t in turns), len(turns)),
        f"{PREFIX}/action_validity": _ratio(valid, valid + invalid),
        f"{PREFIX}/action_effectiveness": _ratio(effective, valid),
    }


def echo_trap_metrics(
    trajectories: list[Trajectory], previous_responses: Container[str] | None = None
) -> dict[str, float]:
    """All Echo-Trap metrics of one training step, keys namespaced `diagnostics/...`.

    `previous_responses` holds responses of earlier steps (a `set[str]` or a bounded
    `ResponseMemory`); add this step's responses to it only after calling this function.
    Returns `{}` for no trajectories; otherwise every key below, always finite:
    reward_std, zero_std_groups, response_length, think_length, empty_think,
    empty_think_ok, distinct_1, distinct_2, identical_in_group, seen_before, format_ok,
    action_validity, action_effectiveness.
    """
    if not trajectories:
        return {}
    groups = group_by_id(trajectories)
    turns = _turns(trajectories)
    out = reward_spread_metrics(groups)
    out.update(length_metrics(turns))
    out.update(diversity_metrics(groups, previous_responses))
    out.update(action_metrics(turns))
    return out


class ResponseMemory:
    """A bounded set of past responses; the oldest are forgotten first (FIFO).

    Pass it as `previous_responses`, then `add` the step's trajectories:

        metrics = echo_trap_metrics(batch, memory)
        memory.add(batch)
    """

    def __init__(self, max_items: int = 10000) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self.max_items = max_items
        # An OrderedDict is an insertion-ordered set with O(1) eviction of the oldest.
        self._items: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, text: object) -> bool:
        return text in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def add_texts(self, texts: Iterable[str]) -> None:
        """Remember `texts`; a repeat is refreshed (moved to the newest end)."""
        for text in texts:
            self._items[text] = None
            self._items.move_to_end(text)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def add(self, trajectories: Iterable[Trajectory]) -> None:
        """Remember the response of every turn of `trajectories`."""
        self.add_texts(turn.response for turn in _turns(trajectories))

    def state_dict(self) -> dict[str, object]:
        """JSON-serialisable state, oldest first (for checkpoints)."""
        return {"max_items": self.max_items, "items": list(self._items)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what `state_dict` returned."""
        self.max_items = int(state["max_items"])  # type: ignore[arg-type]
        self._items = OrderedDict()
        self.add_texts(state["items"])  # type: ignore[arg-type]
