"""`answer_overuse` and the collapse detector's `answers` rule on hand-built streams."""

from __future__ import annotations

import pytest

from starpo.config.diagnostics import DiagnosticsConfig
from starpo.diagnostics.detector import CollapseDetector
from starpo.envs.base import NO_ANSWER
from starpo.evaluation.summary import answer_overuse, summarise
from starpo.types import Trajectory

GOLDS = ["none", "price_mismatch", "quantity_mismatch", "duplicate"] * 4


def test_overuse_is_zero_when_every_answer_is_right():
    assert answer_overuse(GOLDS, GOLDS) == 0.0


def test_overuse_is_one_when_one_label_answers_everything():
    assert answer_overuse(["price_mismatch"] * len(GOLDS), GOLDS) == 1.0


def test_overuse_is_the_largest_share_of_other_cases_one_label_took():
    # "price_mismatch" given to the 4 clean cases and 2 of the 4 quantity ones: 6 of the
    # 12 cases that are not price mismatches; "none" wrongly given once: 1 of 12.
    answers = list(GOLDS)
    for i, gold in enumerate(GOLDS):
        if gold == "none" or (gold == "quantity_mismatch" and i < 8):
            answers[i] = "price_mismatch"
    answers[3] = "none"  # a duplicate called clean
    assert answer_overuse(answers, GOLDS) == pytest.approx(6 / 12)


def test_no_answer_is_not_an_answer_taking_over():
    assert answer_overuse([NO_ANSWER] * len(GOLDS), GOLDS) is None
    assert answer_overuse(["none"] * 3, ["none"] * 3) is None  # no case it is wrong for


def test_summaries_of_tasks_without_answers_have_no_answer_keys():
    summary = summarise([Trajectory("bandit", 0, 0, success=True)])
    assert not [k for k in summary if k.startswith(("answer_", "family_success"))]


def _answer_alerts(overuse: list[float], reward: list[float]) -> list[str | None]:
    """The `answers` rule's severity at each step of a run with these metrics (everything
    else steady; None: no alert)."""
    detector = CollapseDetector(DiagnosticsConfig())
    severities = []
    for step, (o, r) in enumerate(zip(overuse, reward, strict=True), start=1):
        metrics = {
            "train/invoice/answer_overuse": o,
            "train/invoice/reward": r,
            "train/invoice/success": r,
            "actor/entropy": 0.05,
            "rollout/in_group_std": 0.4,
        }
        alerts = {a.rule: a.severity for a in detector.update(step, metrics).alerts}
        severities.append(alerts.get("answers"))
    return severities


def test_answers_taking_over_while_reward_falls_warn_then_collapse():
    overuse = [0.15] * 6 + [0.3, 0.5, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9]
    reward = [0.3, 0.35, 0.4, 0.45, 0.5, 0.55] + [0.5, 0.4, 0.3, 0.25, 0.2, 0.2, 0.2, 0.2]
    severities = _answer_alerts(overuse, reward)
    assert severities[:7] == [None] * 7
    assert "warning" in severities and severities[-1] == "collapse"
    assert severities.index("warning") < severities.index("collapse")


def test_answers_taking_over_while_reward_holds_only_warn():
    severities = _answer_alerts([0.15] * 6 + [0.5, 0.7, 0.8, 0.9] * 2, [0.4] * 14)
    assert set(severities) == {None, "warning"}


def test_an_agent_that_always_leaned_one_way_is_no_new_collapse():
    assert _answer_alerts([0.6] * 14, [0.4] * 14) == [None] * 14


def test_a_warn_threshold_above_the_collapse_one_is_refused():
    with pytest.raises(ValueError, match="answer_warn"):
        DiagnosticsConfig(answer_warn=0.7, answer_collapse=0.6)
