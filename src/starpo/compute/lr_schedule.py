"""The learning-rate schedule both training loops step by (the trainer's AdamW and
`starpo sft`'s): a linear warm-up, then constant or cosine. No torch: option checks read
SCHEDULES."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine")


def lr_multiplier(
    update: int, *, warmup: int, total: int, schedule: str = "constant", min_ratio: float = 0.0
) -> float:
    """Factor on the base learning rate for optimizer update `update` (0-based).

        warm-up (update < W):  (update + 1) / W          (linear; the first update is not 0)
        constant:              1
        cosine:                m + (1 - m) * (1 + cos(pi * p)) / 2,  p = (update - W) / (N - W)
    with W = `warmup`, N = `total` updates in the run, m = `min_ratio`; p is capped at 1.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
    if update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
