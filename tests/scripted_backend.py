"""A fake generation backend that replies with scripted text (token ids in, token ids out,
like a real backend): rollout tests script a policy with it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from starpo.rollout.backends.base import Generation, GenerationRequest, SamplingParams


class ScriptedBackend:
    """Replies `script(session, turn)` for each request; records what it was sent."""

    def __init__(self, tokenizer, script: Callable[[int, int], str]) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.turns: dict[int, int] = {}
        self.received: dict[int, list[int]] = {}

    def generate(self, requests: list[GenerationRequest], params: SamplingParams):
        out = []
        for r in requests:
            turn = self.turns.get(r.session, 0) + 1
            self.turns[r.session] = turn
            self.received.setdefault(r.session, []).extend(r.new_token_ids)
            ids = self.tokenizer.encode(self.script(r.session, turn), add_special_tokens=False)
            ids = ids[: params.max_new_tokens]
            stop = ids[-1:] if ids and ids[-1] in params.stop_token_ids else []
            reason = "stop" if stop else "length"
            out.append(Generation(ids, [-0.5] * len(ids), reason, stop))
        return out

    def release(self, sessions: Iterable[int]) -> None:
        list(sessions)

    def reset(self) -> None:
        self.turns.clear()
