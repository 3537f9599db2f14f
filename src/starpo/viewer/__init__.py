"""The rollout viewer: a self-contained static HTML page built from result files.

It only reads what training (`trajectories/`, `val_trajectories/`, `metrics.jsonl`,
`alerts.jsonl`) and `starpo eval` (`trajectories.jsonl`, `summary.json`) wrote.
"""

from __future__ import annotations

from starpo.viewer.html import build_viewer
from starpo.viewer.serve import serve, view_main

__all__ = ["build_viewer", "serve", "view_main"]
