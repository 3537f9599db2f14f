"""A bounded load test of `starpo serve`: N concurrent clients x M chat requests each.

    python bench/bench_serve.py [--model smollm2-135m-instruct] [--clients 8] [--requests 4]
                                [--max-tokens 32] [--backend auto] [--dtype auto]

Starts the server in this process on 127.0.0.1 (a free port), waits for it, then runs a
fixed number of requests (clients x requests, each client one thread with the official
openai client, sampled at temperature 0.7 with a per-request seed) and prints requests/s,
completion tokens/s, whether every request was answered, how many batched generate calls
served them, and the CPU capability torch dispatches to. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The tests' server-in-a-thread helper (uvicorn on 127.0.0.1, bounded waits).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))
from serving import running  # noqa: E402

START_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 300.0
QUESTIONS = [
    "Name a primary colour.",
    "What is 7 times 6?",
    "Give me a word that rhymes with cat.",
    "Which planet is closest to the sun?",
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--backend", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-batch", type=int, default=8)
    return p.parse_args()


class Counting:
    """Counts the backend's generate calls (the batches)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def generate(self, requests, params):
        self.calls += 1
        return self.inner.generate(requests, params)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def main() -> int:
    import torch

    from starpo.cli.serve import load_app

    args = parse_args()
    loaded = time.perf_counter()
    app = load_app(args.model, backend=args.backend, dtype=args.dtype, max_batch=args.max_batch)
    batcher = app.state.batcher
    batcher.backend = counting = Counting(batcher.backend)  # the worker reads it per call
    print(f"loaded {args.model} in {time.perf_counter() - loaded:.1f}s")
    with running(app, wait_s=START_TIMEOUT_S) as url:
        total, tokens, failures, seconds, calls = run_load(args, f"{url}/v1", counting)
    report(args, total, tokens, failures, seconds, calls)
    print(
        f"cpu capability: {torch.backends.cpu.get_cpu_capability()}, threads: "
        f"{torch.get_num_threads()}"
    )
    return 0 if failures == 0 and len(tokens) == total else 1


def run_load(args, base_url: str, counting: Counting) -> tuple[int, list[int], int, float, int]:
    """The fixed load against `base_url`: (requests, completion tokens of each answered
    one, requests lost, seconds, batched generate calls)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="x", timeout=REQUEST_TIMEOUT_S, max_retries=0)

    def one(index: int) -> int:
        reply = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
            max_tokens=args.max_tokens,
            temperature=0.7,
        )
        return reply.usage.completion_tokens

    def client_loop(client_index: int) -> list[int]:
        return [one(client_index * args.requests + r) for r in range(args.requests)]

    one(0)  # warm-up: first-call costs are not load
    calls_before = counting.calls
    total = args.clients * args.requests
    started = time.perf_counter()
    failures = 0
    tokens: list[int] = []
    with ThreadPoolExecutor(args.clients) as pool:
        for future in [pool.submit(client_loop, c) for c in range(args.clients)]:
            try:
                tokens.extend(future.result(timeout=REQUEST_TIMEOUT_S * args.requests))
            except Exception as exc:  # a lost client: counted, reported
                failures += args.requests
                print(f"client failed: {type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    return total, tokens, failures, seconds, counting.calls - calls_before


def report(args, total, tokens, failures, seconds, calls) -> None:
    answered = len(tokens)
    print(
        f"{args.clients} clients x {args.requests} requests, max_tokens {args.max_tokens}: "
        f"{answered}/{total} answered, {total - answered} lost, in {seconds:.1f}s"
    )
    print(f"requests/s: {answered / seconds:.2f}")
    print(f"completion tokens/s: {sum(tokens) / seconds:.1f} ({sum(tokens)} tokens)")
    print(f"generate calls: {calls} (mean batch {answered / max(calls, 1):.1f})")


if __name__ == "__main__":
    sys.exit(main())
