"""Per-step metrics that diagnose the Echo Trap (RAGEN's name for StarPO's collapse).

Collapse shows first as falling in-group reward spread and entropy, then shrinking
reasoning and repetitive outputs (RAGEN, arXiv 2504.20073). `echo_trap_metrics` turns one step's
trajectories into flat `diagnostics/...` floats for the sinks and for `CollapseDetector`.
It computes only what nothing else logs: the in-group reward std is `rollout/in_group_std`
(the StarPO-S filter's), lengths, format and action rates are the episode summary's
(`train/<env>/mean_think_tokens`, ... from `starpo.evaluation.summary.summarise`).

Conventions (all nan-safe: no nan or inf is ever returned):
- No trajectories -> `{}` (nothing to log this step).
- A ratio whose denominator is zero is 0.0 (e.g. empty_think_ok with no well-formed turn).
- "Response" means one turn's `Turn.response` text; "tokens" for distinct-n are its
  whitespace-separated words.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Container, Iterable, Iterator

from starpo.stats import mean, ratio
from starpo.types import Trajectory, Turn, by_group

PREFIX = "diagnostics"


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


def empty_think_metrics(turns: list[Turn]) -> dict[str, float]:
    """The shares of turns without reasoning.

    `empty_think` counts every turn whose `think == ""`, malformed turns included (their
    think is "" by construction: the policy produced no usable reasoning either way);
    `empty_think_ok` restricts to well-formed turns (`format_ok`), so it separates
    "stopped reasoning" from "broke the format". With thinking disabled both are 1.0.
    """
    ok = [t for t in turns if t.format_ok]
    return {
        f"{PREFIX}/empty_think": ratio(sum(t.think == "" for t in turns), len(turns)),
        f"{PREFIX}/empty_think_ok": ratio(sum(t.think == "" for t in ok), len(ok)),
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
        out[f"{PREFIX}/distinct_{n}"] = mean([v for v in values if v is not None])
    total = sum(len(texts) for texts in texts_by_group)
    duplicates = sum(duplicate_count(texts) for texts in texts_by_group)
    out[f"{PREFIX}/identical_in_group"] = ratio(duplicates, total)
    seen = 0
    if previous is not None:
        seen = sum(text in previous for texts in texts_by_group for text in texts)
    out[f"{PREFIX}/seen_before"] = ratio(seen, total)
    return out


def echo_trap_metrics(
    trajectories: list[Trajectory], previous_responses: Container[str] | None = None
) -> dict[str, float]:
    """The Echo-Trap metrics of one training step, keys namespaced `diagnostics/...`.

    `previous_responses` holds responses of earlier steps (a `set[str]` or a bounded
    `ResponseMemory`); add this step's responses to it only after calling this function.
    Returns `{}` for no trajectories; otherwise every key below, always finite:
    empty_think, empty_think_ok, distinct_1, distinct_2, identical_in_group, seen_before.
    """
    if not trajectories:
        return {}
    groups = list(by_group(trajectories).values())
    out = empty_think_metrics(_turns(trajectories))
    out.update(diversity_metrics(groups, previous_responses))
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
