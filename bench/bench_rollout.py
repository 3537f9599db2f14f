"""Multi-turn rollout speed: the engine against re-encoding every turn with `generate`.

    python bench/bench_rollout.py [--env sokoban] [--episodes 32] [--turns 5] [--tokens 32]

All contenders play the same episodes greedily, side by side in one process:

- naive `generate`: each turn, transformers' `model.generate` re-encodes every episode's
  whole dialogue so far (left-padded batch) and decodes the reply: no state kept between
  turns. This is the baseline the issue names.
- engine, hf fp32: the rollout engine on `HFBackend` (each episode's KV cache is kept, so
  a turn encodes only the new observation).
- engine, lean fp32: the engine on `LeanBackend` with the model's fp32 weights.
- engine, lean bf16: the same with a bf16 weight copy (the default on a CPU with native
  bf16); its greedy tokens may differ from fp32 ones, so the share that is identical is
  printed instead of a yes/no.

Printed: generated tokens, seconds, generated tokens/s, the speed-up over the baseline, and
whether each contender's greedy tokens are identical to the baseline's. stop_at_answer is
off (the baseline can stop only at the end-of-turn token, as `generate` does).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from starpo.models import load_model
from starpo.rollout import EpisodeSettings, RolloutEngine
from starpo.rollout.backends.base import (
    BackendNumerics,
    Generation,
    GenerationRequest,
    SamplingParams,
    ends_with_stop,
)
from starpo.rollout.backends.hf import HFBackend
from starpo.rollout.backends.lean import LeanBackend


class GenerateEveryTurn:
    """The naive multi-turn baseline as a `GenerationBackend`: keeps only each episode's
    token history and calls `model.generate` on all of it every turn (greedy)."""

    numerics = BackendNumerics("generate", "float32", True)

    def __init__(self, model: Any, pad_token_id: int):
        self.model, self.pad = model, pad_token_id
        self.history: dict[int, list[int]] = {}

    def reset(self) -> None:
        self.history = {}

    def release(self, sessions) -> None:
        for session in sessions:
            self.history.pop(session, None)

    def seed(self, seed: int) -> None:
        pass  # greedy

    def update_weights(self, model: Any, version: int) -> None:
        pass

    @torch.no_grad()
    def generate(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[Generation]:
        dialogues = []
        for request in requests:
            self.history.setdefault(request.session, []).extend(request.new_token_ids)
            dialogues.append(self.history[request.session])
        width = max(len(d) for d in dialogues)
        ids = torch.full((len(dialogues), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, dialogue in enumerate(dialogues):
            ids[row, width - len(dialogue) :] = torch.tensor(dialogue)
            mask[row, width - len(dialogue) :] = 1
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=list(params.stop_token_ids),
            pad_token_id=self.pad,
            output_scores=True,
            return_dict_in_generate=True,
        )
        logprobs = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
        results = []
        for row, dialogue in enumerate(dialogues):
            tokens: list[int] = []
            stop = None
            for step, token in enumerate(out.sequences[row, width:].tolist()):
                tokens.append(token)
                stop = ends_with_stop(tokens, params)
                if stop is not None or step + 1 == params.max_new_tokens:
                    break
            dialogue.extend(tokens)
            picked = logprobs[row, torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
            results.append(Generation(tokens, picked, "stop" if stop else "length", stop or []))
        return results


def play(backend: Any, tokenizer: Any, args: argparse.Namespace) -> tuple[float, list]:
    settings = EpisodeSettings(
        max_turns=args.turns,
        max_new_tokens=args.tokens,
        temperature=0.0,
        stop_at_answer=False,
        think=True,
    )
    engine = RolloutEngine(backend, tokenizer, settings)
    seeds = list(range(10000, 10000 + args.episodes))
    started = time.perf_counter()
    trajectories = engine.run(args.env, seeds, group_size=1)
    return time.perf_counter() - started, trajectories


def agent_tokens(trajectory) -> list[int]:
    return [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--env", default="sokoban")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32, help="max new tokens per turn")
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    pad = tokenizer.pad_token_id
    contenders = {
        "naive generate": GenerateEveryTurn(model, pad),
        "engine, hf fp32": HFBackend(model, pad_token_id=pad),
        "engine, lean fp32": LeanBackend(model, pad_token_id=pad),
        "engine, lean bf16": LeanBackend(model, pad_token_id=pad, weights_dtype=torch.bfloat16),
    }
    warm = argparse.Namespace(**{**vars(args), "turns": 1, "episodes": 2, "tokens": 4})
    results = {}
    for name, backend in contenders.items():
        play(backend, tokenizer, warm)
        results[name] = play(backend, tokenizer, args)
        print(f"  {name}: {results[name][0]:.1f} s", file=sys.stderr, flush=True)
    base_s, base = results["naive generate"]
    base_tokens = [agent_tokens(t) for t in base]
    turns = sum(len(t.turns) for t in base)
    print(
        f"{args.model} on {args.env}: {args.episodes} episodes, up to {args.turns} turns "
        f"({turns} played by the baseline), <= {args.tokens} new tokens per turn, greedy, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'contender':<20}{'tokens':>8}{'seconds':>9}{'tok/s':>8}{'speed-up':>10}  identical")
    base_rate = sum(map(len, base_tokens)) / base_s
    for name, (elapsed, trajectories) in results.items():
        tokens = [agent_tokens(t) for t in trajectories]
        rate = sum(map(len, tokens)) / elapsed
        same = sum(a == b for a, b in zip(tokens, base_tokens, strict=True))
        verdict = "yes" if same == len(tokens) else f"{same}/{len(tokens)} episodes"
        print(
            f"{name:<20}{sum(map(len, tokens)):>8}{elapsed:>9.1f}{rate:>8.1f}"
            f"{rate / base_rate:>9.2f}x  {verdict}"
        )


if __name__ == "__main__":
    main()
