"""Echo-Trap diagnostics: per-step collapse metrics, RAGEN-2's template-collapse metrics
(`template_collapse`) and an online collapse detector.

Imports only `starpo.types`, `starpo.config` (for its `diagnostics` section), the
standard library and numpy (never torch).
"""

from __future__ import annotations

from starpo.config.diagnostics import DiagnosticsConfig
from starpo.diagnostics.detector import (
    AlertLog,
    CollapseDetector,
    DetectorVerdict,
    state_metrics,
)
from starpo.diagnostics.metrics import ResponseMemory, echo_trap_metrics
from starpo.diagnostics.rules import RULES, Alert

__all__ = [
    "RULES",
    "Alert",
    "AlertLog",
    "CollapseDetector",
    "DiagnosticsConfig",
    "DetectorVerdict",
    "ResponseMemory",
    "echo_trap_metrics",
    "state_metrics",
]
