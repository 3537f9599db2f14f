"""Wall-clock seconds per phase of a job, without hand-kept timestamps.

timer = Timer()
with timer("rollout"):
    ...
timer.metrics()  # {"timing_s/rollout": 1.23}
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timer:
    """Adds the seconds spent inside `with timer(name):` blocks to `seconds[name]`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def metrics(self, prefix: str = "timing_s/") -> dict[str, float]:
        return {f"{prefix}{name}": value for name, value in self.seconds.items()}
