"""Whether and when a finished run collapsed, read from its validation curve: the one
definition the Echo-Trap comparisons report (the detector, `detector.py`, warns during a
run from training signals; this judges a run afterwards from what it achieved).

A run **collapsed at step s** when its validation success at s has fallen at least
`COLLAPSE_DROP` (20 points) under the best validation success reached up to s, and every
later validation stays that far under that best: the run lost what it had learned and did
not get it back. A run that never does is "not collapsed by its last step".
"""

from __future__ import annotations

from collections.abc import Sequence

#: How far under its best so far validation success must fall, and stay, to count.
COLLAPSE_DROP = 0.20


def collapse_step(
    steps: Sequence[int], successes: Sequence[float], drop: float = COLLAPSE_DROP
) -> int | None:
    """The step the run collapsed at (see the module doc), or None.

    `steps`, `successes`: the validation curve in step order (NaN points are skipped)."""
    points = [(s, v) for s, v in zip(steps, successes, strict=True) if v == v]
    best = float("-inf")
    for i, (step, value) in enumerate(points):
        best = max(best, value)
        if value <= best - drop and all(v <= best - drop for _, v in points[i + 1 :]):
            return step
    return None


def best_success(successes: Sequence[float]) -> float | None:
    """The best validation success (None for a curve without a finite point)."""
    finite = [v for v in successes if v == v]
    return max(finite) if finite else None
