"""Echo-Trap metrics on hand-built trajectories, against values computed by hand.

The quantities logged elsewhere (in-group reward std by the StarPO-S filter; lengths,
format and action rates by the episode summary) are checked here through their owners."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from starpo.algorithms import filter_groups
from starpo.diagnostics.metrics import (
    ResponseMemory,
    distinct_n,
    duplicate_count,
    echo_trap_metrics,
)
from starpo.evaluation.summary import summarise
from starpo.stats import sample_std
from starpo.types import Trajectory, Turn


def turn(response: str, reward: float = 0.0, **kw) -> Turn:
    fields = dict(
        state="s",
        response=response,
        think=kw.pop("think", "t"),
        actions=[],
        executed=[],
        format_ok=kw.pop("format_ok", True),
        env_reward=reward,
        reward=reward,
    )
    fields.update(kw)
    return Turn(**fields)


def traj(group: int, *turns: Turn) -> Trajectory:
    return Trajectory(env_id="Bandit", seed=group, group=group, turns=list(turns))


@pytest.fixture
def batch() -> list[Trajectory]:
    # Group 0: rewards 1 and 0 (std = sqrt(0.5)); group 1: rewards 2 and 2 (std 0).
    return [
        traj(
            0,
            turn("a b c", 1.0, response_tokens=4, think_tokens=2, num_valid=2, num_effective=1),
            turn("a b", 0.0, think="", response_tokens=2, think_tokens=0, num_invalid=1),
        ),
        traj(0, turn("a b", 0.0, response_tokens=2, think_tokens=0, format_ok=False, think="")),
        traj(1, turn("x y", 2.0, response_tokens=3, think_tokens=1, num_valid=1)),
        traj(1, turn("x y", 2.0, response_tokens=3, think_tokens=1, num_valid=1, num_effective=1)),
    ]


def test_helpers():
    assert sample_std([1.0]) == 0.0
    assert sample_std([1.0, 0.0]) == pytest.approx(math.sqrt(0.5))
    assert distinct_n(["a b", "a b"], 2) == pytest.approx(0.5)
    assert distinct_n(["a", "b"], 2) is None  # no bigram at all
    assert duplicate_count(["a", "b", "a", "a"]) == 3


def test_echo_trap_metrics_by_hand(batch):
    m = echo_trap_metrics(batch)
    spread = filter_groups([[1.0, 0.0], [2.0, 2.0]], 1.0)  # the batch's group rewards
    assert spread.std_all == pytest.approx(math.sqrt(0.5) / 2)  # rollout/in_group_std
    assert spread.zero_std_groups == pytest.approx(0.5)  # rollout/zero_std_groups
    summary = summarise(batch)  # logged as train/<env>/...
    assert summary["mean_response_tokens"] == pytest.approx(14 / 5)
    assert summary["mean_think_tokens"] == pytest.approx(4 / 5)
    assert m["diagnostics/empty_think"] == pytest.approx(2 / 5)
    assert m["diagnostics/empty_think_ok"] == pytest.approx(1 / 4)  # malformed turn excluded
    # Group 0 words: a b c | a b | a b -> 3 unique / 7; group 1: x y | x y -> 2 / 4.
    assert m["diagnostics/distinct_1"] == pytest.approx((3 / 7 + 2 / 4) / 2)
    # Group 0 bigrams: ab bc | ab | ab -> 2 / 4; group 1: xy | xy -> 1 / 2.
    assert m["diagnostics/distinct_2"] == pytest.approx((2 / 4 + 1 / 2) / 2)
    # "a b" twice in group 0, "x y" twice in group 1 -> 4 of 5 responses.
    assert m["diagnostics/identical_in_group"] == pytest.approx(4 / 5)
    assert m["diagnostics/seen_before"] == 0.0
    assert summary["format_ok"] == pytest.approx(4 / 5)
    assert summary["valid_action_rate"] == pytest.approx(4 / 5)
    assert summary["effective_action_rate"] == pytest.approx(2 / 4)
    assert set(m).isdisjoint(f"diagnostics/{k}" for k in summary)  # one key per quantity


def test_identical_is_within_group_only():
    batch = [traj(0, turn("same words")), traj(1, turn("same words"))]
    assert echo_trap_metrics(batch)["diagnostics/identical_in_group"] == 0.0


def test_seen_before_with_memory(batch):
    memory = ResponseMemory(max_items=10)
    memory.add([batch[0]])  # remembers "a b c" and "a b"
    m = echo_trap_metrics(batch, memory)
    assert m["diagnostics/seen_before"] == pytest.approx(3 / 5)
    assert echo_trap_metrics(batch, {"x y"})["diagnostics/seen_before"] == pytest.approx(2 / 5)


def test_empty_and_degenerate_inputs_are_finite():
    assert echo_trap_metrics([]) == {}
    degenerate = [traj(0), traj(0, turn("", think="", format_ok=False))]
    m = echo_trap_metrics(degenerate)
    summary = summarise(degenerate)
    assert all(math.isfinite(v) for v in m.values())
    assert summary["valid_action_rate"] == 0.0
    assert summary["effective_action_rate"] == 0.0
    assert m["diagnostics/distinct_2"] == 0.0
    assert m["diagnostics/empty_think_ok"] == 0.0


def test_response_memory_is_bounded_fifo():
    memory = ResponseMemory(max_items=3)
    memory.add_texts(["a", "b", "c"])
    memory.add_texts(["a", "d"])  # "a" refreshed, so "b" is the oldest and goes
    assert list(memory) == ["c", "a", "d"]
    assert "b" not in memory and len(memory) == 3
    restored = ResponseMemory()
    restored.load_state_dict(memory.state_dict())
    assert list(restored) == ["c", "a", "d"] and restored.max_items == 3
    with pytest.raises(ValueError):
        ResponseMemory(0)


def test_diagnostics_never_imports_torch():
    code = "import sys, starpo.diagnostics; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
