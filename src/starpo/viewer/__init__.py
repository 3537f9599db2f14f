"""Displays of a run folder: the rollout viewer (a self-contained static HTML page) and
`report` (PNG plots of metrics; import `starpo.viewer.report`, it loads matplotlib).

Both only read what training (`trajectories/`, `val_trajectories/`, `metrics.jsonl`,
`alerts.jsonl`) and `starpo eval` (`trajectories.jsonl`, `summary.json`) wrote, through
`starpo.runs`, which owns those names and the JSONL reading rule.
"""

from __future__ import annotations

from starpo.viewer.html import build_viewer
from starpo.viewer.http import serve, view_main

__all__ = ["build_viewer", "serve", "view_main"]
