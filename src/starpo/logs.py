"""Console messages of long jobs through `logging` (logger "starpo.*"), shown on stderr.

Libraries embedding starpo can silence or redirect them with the standard logging
configuration; the `starpo` command and `Trainer(quiet=False)` show them as plain lines.
"""

from __future__ import annotations

import logging
import sys


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of each message (so redirections and
    test captures made after start-up see the lines)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ assigns it
        pass


def console_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)` under "starpo", with one plain stderr handler on "starpo"
    unless the application configured that logger itself."""
    root = logging.getLogger("starpo")
    if not root.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False  # no duplicate lines through the root logger
    return logging.getLogger(name)


def warn(message: str, logger: str = "starpo") -> None:
    """A `warning: ...` line on the console (logger `logger`, level WARNING)."""
    console_logger(logger).warning(f"warning: {message}")
