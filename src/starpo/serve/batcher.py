"""Gathers concurrent chat requests into batched `backend.generate` calls.

One worker thread owns the backend: the backends keep per-session KV caches and are not
thread-safe, so every call (reset, seed, generate) happens on that thread. Requests come in
through a queue from any thread (the server's event loop) and get a `Future` back.

Requests batch together only when their sampling settings are equal (temperature, top_p,
max_tokens, seed): one `generate` call takes one `SamplingParams`, and a seed applies to the
whole call. Different settings go in separate calls, in arrival order of their first request.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from starpo.rollout.backends.base import (
    Generation,
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
)

#: How long the worker waits for more requests after the first one of a batch (seconds).
#: Short against a decode (tens of ms) and long enough for clients that start together.
GATHER_S = 0.01


@dataclass(frozen=True)
class BatchKey:
    """The settings a batch shares."""

    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None = None


@dataclass
class Job:
    prompt_ids: list[int]
    key: BatchKey
    future: Future[Generation] = field(default_factory=Future)


class Batcher:
    """`submit(prompt_ids, key)` -> a Future of the `Generation`; at most `max_batch`
    prompts per generate call."""

    def __init__(
        self,
        backend: GenerationBackend,
        stop_token_ids: list[int],
        *,
        max_batch: int = 8,
        gather_s: float = GATHER_S,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.backend = backend
        self.stop_token_ids = tuple(stop_token_ids)
        self.max_batch = max_batch
        self.gather_s = gather_s
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._pending: list[Job] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="starpo-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], key: BatchKey) -> Future[Generation]:
        if self._closed.is_set():
            raise RuntimeError("the batcher is closed")
        job = Job(list(prompt_ids), key)
        self._queue.put(job)
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker after its current call; requests still waiting fail."""
        self._closed.set()
        self._queue.put(None)  # wakes a worker blocked on an empty queue
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._closed.is_set():
            if not self._gather():
                continue
            batch = self._take_batch()
            self._generate(batch)
        for job in self._pending + self._drain():
            job.future.set_exception(RuntimeError("the server is shutting down"))

    def _gather(self) -> bool:
        """Move queued jobs to `_pending`: wait for a first one, then `gather_s` for more."""
        if not self._pending:
            first = self._queue.get()
            if first is None:
                return False
            self._pending.append(first)
            try:
                while True:
                    job = self._queue.get(timeout=self.gather_s)
                    if job is None:
                        return False
                    self._pending.append(job)
            except queue.Empty:
                pass
        self._pending.extend(self._drain())
        return not self._closed.is_set()

    def _drain(self) -> list[Job]:
        """Whatever is queued right now (no waiting)."""
        jobs = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return jobs
            if job is not None:
                jobs.append(job)

    def _take_batch(self) -> list[Job]:
        """The oldest job and up to max_batch - 1 later ones with its settings."""
        key = self._pending[0].key
        batch = [job for job in self._pending if job.key == key][: self.max_batch]
        taken = {id(job) for job in batch}
        self._pending = [job for job in self._pending if id(job) not in taken]
        return batch

    def _generate(self, batch: list[Job]) -> None:
        key = batch[0].key
        params = SamplingParams(
            max_new_tokens=key.max_tokens,
            temperature=key.temperature,
            top_p=key.top_p,
            stop_token_ids=self.stop_token_ids,
        )
        requests = [GenerationRequest(i, job.prompt_ids) for i, job in enumerate(batch)]
        try:
            self.backend.reset()  # each call starts fresh sessions 0..n-1
            if key.seed is not None:
                self.backend.seed(key.seed)
            results = self.backend.generate(requests, params)
        except Exception as exc:  # the requests fail, the server goes on
            for job in batch:
                job.future.set_exception(exc)
            return
        for job, result in zip(batch, results, strict=True):
            job.future.set_result(result)
