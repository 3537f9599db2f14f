"""How the trainer writes a checkpoint: in its own thread, or in a background thread from
a snapshot of the state (`trainer.checkpoint_async`), one write at a time.

Both use `save_checkpoint`'s atomic protocol, so a crash while a background write is in
flight leaves the previous checkpoint the newest complete one.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from starpo import runs
from starpo.errors import UserError
from starpo.logs import warn
from starpo.trainer.checkpoints.store import checkpoint_bytes, save_checkpoint

#: What trainer.checkpoint_contents=weights leaves out of `Trainer.checkpoint_state`:
#: AdamW's moments (2/3 of a full checkpoint). The schedules, RNG, diagnostics and
#: counters are a few KB and stay.
OPTIMIZER_KEYS = ("actor_optim", "critic_optim")


def snapshot(obj: Any, reuse: Any = None) -> Any:
    """A copy of (part of) a checkpoint state that later training steps cannot change:
    tensors copied into host memory, containers rebuilt, anything else deep-copied.

    `reuse`: an earlier snapshot of the same layout that nobody reads any more; its host
    tensors of the same shape and dtype are overwritten instead of allocating new ones
    (fresh memory costs page faults: about twice the copy's time)."""
    if isinstance(obj, torch.Tensor):
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.device.type == "cpu"
            and (reuse.shape, reuse.dtype) == (obj.shape, obj.dtype)
        ):
            return reuse.copy_(obj.detach())
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        old = reuse if isinstance(reuse, dict) else {}
        return {key: snapshot(value, old.get(key)) for key, value in obj.items()}
    if type(obj) in (list, tuple):  # not namedtuples: deep-copied below
        old = reuse if type(reuse) is type(obj) and len(reuse) == len(obj) else [None] * len(obj)
        return type(obj)(snapshot(value, was) for value, was in zip(obj, old, strict=True))
    return copy.deepcopy(obj)


@dataclass(frozen=True)
class Target:
    """One place a state is saved to: `run_dir/checkpoints/`, keeping the newest `keep` and
    every one whose step is a multiple of `keep_every` (0: none)."""

    run_dir: Path
    keep: int
    keep_every: int = 0


@dataclass(frozen=True)
class Written:
    """A finished checkpoint write: the folder (of the last target), its size, its seconds."""

    path: Path
    bytes: int
    seconds: float


def write_checkpoint(step: int, state: dict[str, Any], targets: list[Target]) -> Written:
    """Save `state` to every target, in order, in this thread."""
    started = time.perf_counter()
    path = None
    for target in targets:
        path = save_checkpoint(
            target.run_dir, step, state, keep=target.keep, keep_every=target.keep_every
        )
    assert path is not None, "no target"
    return Written(path, checkpoint_bytes(path), time.perf_counter() - started)


class BackgroundWriter:
    """Writes one checkpoint at a time in a background thread.

    `start` hands over a state nobody else changes (see `snapshot`). `wait` blocks until
    the write in flight is done and returns it once; a write that failed raises there, as
    a one-line UserError naming the checkpoint and the cause, so it is never lost. The
    thread is not a daemon: an interpreter that exits normally finishes the write first.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._written: Written | None = None
        self._error: BaseException | None = None
        self._path: Path | None = None

    @property
    def busy(self) -> bool:
        """Whether a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, step: int, state: dict[str, Any], targets: list[Target]) -> Path:
        """Begin writing `state`; returns the folder it will have once complete."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint write is still in flight: wait() first")
        final = targets[-1]
        self._path = runs.RunFolder(final.run_dir).checkpoints / runs.step_name(step)
        self._thread = threading.Thread(
            target=self._run, args=(step, state, targets), name=f"starpo-checkpoint-{step}"
        )
        self._thread.start()
        return self._path

    def _run(self, step: int, state: dict[str, Any], targets: list[Target]) -> None:
        try:
            self._written = write_checkpoint(step, state, targets)
        except BaseException as exc:  # handed to the main thread by wait()
            self._error = exc

    def wait(self) -> Written | None:
        """Block until the write in flight (if any) is done; what it wrote, or None when
        no write was in flight. A failed write raises UserError here."""
        if self._thread is None:
            return None
        self._thread.join()
        written, error, path = self._written, self._error, self._path
        self._thread = self._written = self._error = self._path = None
        if error is not None:
            from starpo.distributed.cluster import first_line

            raise UserError(
                f"checkpoint {path} was not written ({first_line(error)[:200]}); the "
                "previous checkpoint is still the one --resume loads"
            ) from error
        return written

    def poll(self) -> Written | None:
        """What the finished write wrote, without blocking: None while one is in flight
        or when there is none. A failed write raises UserError (see `wait`)."""
        return None if self.busy else self.wait()

    def close(self) -> None:
        """Wait for the write in flight; a failure is only warned about (for `finally:`
        blocks, where another error may be on its way out)."""
        try:
            self.wait()
        except UserError as exc:
            warn(str(exc), "starpo.checkpoint")


class CheckpointSaver:
    """The trainer's checkpoint writes, in its thread or in the background, and their
    cost (perf/checkpoint_*), logged with the step after each save: a crash between the
    two must not leave a checkpoint whose step has no metrics line."""

    def __init__(self, background: bool, say: Callable[[str], None]) -> None:
        self.background, self.say = background, say
        self.writer = BackgroundWriter()
        self.cost: dict[str, float] = {}  # not logged yet
        self.previous: dict[str, Any] | None = None  # the last snapshot, reused by the next
        self.blocked_s = 0.0  # how long the latest save held up its step

    def save(
        self, step: int, build_state: Callable[[int], dict[str, Any]], targets: list[Target]
    ) -> Path:
        """Wait for the write in flight, build the state and write it (in the background:
        a snapshot of it); the checkpoint folder, once the write has ended."""
        started = time.perf_counter()
        self._collect(self.writer.wait())  # one write in flight at most
        state = build_state(step)
        if self.background:
            # Later updates change the live tensors in place. The previous snapshot's write
            # has ended (waited for above), so its memory is free to take this one.
            state = self.previous = snapshot(state, reuse=self.previous)
            path = self.writer.start(step, state, targets)
            self.blocked_s = self.cost["perf/checkpoint_s"] = time.perf_counter() - started
            return path
        written = write_checkpoint(step, state, targets)
        seconds, size_mb = time.perf_counter() - started, written.bytes / 2**20
        self.cost.update({"perf/checkpoint_s": seconds, "perf/checkpoint_mb": size_mb})
        self.say(f"checkpoint {written.path.name}: {size_mb:.1f} MB in {seconds:.1f} s")
        return written.path

    def _collect(self, written: Written | None) -> None:
        """A finished background write's seconds and size, to log with the next step."""
        if written is None:
            return
        size_mb = written.bytes / 2**20
        self.cost["perf/checkpoint_write_s"] = written.seconds
        self.cost["perf/checkpoint_mb"] = size_mb
        self.say(
            f"checkpoint {written.path.name}: {size_mb:.1f} MB in {written.seconds:.1f} s in "
            f"the background (the step waited {self.blocked_s:.1f} s)"
        )

    def take_cost(self) -> dict[str, float]:
        """The perf/checkpoint_* metrics not logged yet, once: the last save's blocking
        seconds, and a background write's seconds and size as soon as it has ended."""
        self._collect(self.writer.poll())
        cost, self.cost = self.cost, {}
        return cost

    def wait(self) -> None:
        """Block until the background write (if any) has ended; raises its error."""
        self._collect(self.writer.wait())

    def close(self) -> None:
        """Let the write in flight finish; a failure is warned about, not raised."""
        self.writer.close()
