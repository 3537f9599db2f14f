"""The collapse definition the Echo-Trap comparisons report (`diagnostics.outcome`)."""

from __future__ import annotations

import math

from starpo.diagnostics.outcome import best_success, collapse_step


def test_a_run_that_falls_and_stays_down_collapsed_where_it_fell():
    steps = [0, 5, 10, 15, 20, 25]
    assert collapse_step(steps, [0.1, 0.6, 0.95, 0.8, 0.5, 0.52]) == 20  # 0.8: 15 points under
    assert collapse_step(steps, [0.1, 0.6, 0.95, 0.74, 0.6, 0.5]) == 15


def test_a_dip_it_recovers_from_is_no_collapse():
    assert collapse_step([0, 5, 10, 15], [0.2, 0.9, 0.5, 0.85]) is None
    assert collapse_step([0, 5, 10], [0.2, 0.5, 0.9]) is None  # learning, never falling


def test_the_last_validation_alone_can_show_a_collapse_and_nan_points_are_skipped():
    assert collapse_step([0, 5, 10], [0.1, 0.9, 0.6]) == 10
    assert collapse_step([0, 5, 10, 15], [0.1, 0.9, math.nan, 0.65]) == 15
    assert collapse_step([], []) is None
    assert best_success([0.2, math.nan, 0.7]) == 0.7
    assert best_success([math.nan]) is None
