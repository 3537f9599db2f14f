"""Shared by the tests that compare whole runs: which logged metrics must match exactly."""

from __future__ import annotations

#: Wall-clock figures: they differ between any two runs, however exact the training.
TIMING_PREFIXES = ("timing_s/", "perf/")


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics rows without timings or throughput: what equal runs log identically."""
    return [{k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)} for row in rows]
