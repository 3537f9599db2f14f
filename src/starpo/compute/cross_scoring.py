"""Cross-scoring: the log-prob of every reply of a sample under every prompt of it, the
N x N matrix behind RAGEN-2's template-collapse metrics (`diagnostics.template_collapse`).

Row (i, j) of the scoring batch is prompt i followed by reply j, its loss mask on reply
j's tokens; rows come prompt by prompt, so a pass over whole prompts lets
`forward.forward_plan` encode each prompt once for the replies scored under it (packed,
or through a shared KV cache) wherever that is cheaper than the padded rows. Every path
it picks is exact, so the matrix equals scoring each pair on its own. A prompt or reply
that occurs twice in the sample (rollouts of one group share their first prompt; a
bandit's replies are few) is scored once: the prompt tokens dominate the cost, and the
copies' entries are then equal exactly, as they should be.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from starpo.compute.batch import TrainBatch, padded
from starpo.compute.forward import policy_logprobs


def pair_batch(
    prompts: Sequence[Sequence[int]], replies: Sequence[Sequence[int]], pad_token_id: int
) -> TrainBatch:
    """A right-padded batch of rows prompt + reply for each (prompt, reply) in order, the
    loss mask on the reply's tokens; the fields the update needs are zeros."""
    rows = [list(p) + list(r) for p, r in zip(prompts, replies, strict=True)]
    width = max(len(row) for row in rows)
    ids = padded(rows, width, pad_token_id, torch.long)
    attention = padded([[1] * len(row) for row in rows], width, 0, torch.long)
    masks = [[0.0] * len(p) + [1.0] * len(r) for p, r in zip(prompts, replies, strict=True)]
    return TrainBatch.for_scoring(ids, attention, padded(masks, width))


@torch.no_grad()
def reply_logprobs(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    replies: Sequence[Sequence[int]],
    temperature: float,
    pad_token_id: int,
) -> torch.Tensor:
    """(len(prompts),) float64 log p(reply | prompt) of each pair: the sum of the reply
    tokens' log-probs at `temperature`, in one forward pass (`policy_logprobs`)."""
    batch = pair_batch(prompts, replies, pad_token_id)
    batch = batch.to(next(model.parameters()).device)
    logprobs, _ = policy_logprobs(model, batch, temperature, with_entropy=False)
    return logprobs.double().sum(dim=1).cpu()


@torch.no_grad()
def cross_scores(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    replies: Sequence[Sequence[int]],
    temperature: float,
    pad_token_id: int,
    max_rows: int,
) -> torch.Tensor:
    """(N, N) float64 S[i, j] = log p(reply_j | prompt_i) under `model` at `temperature`.

    Distinct prompts and replies are scored once each (`distinct`). Passes hold whole
    prompts (at least one, at most `max_rows` rows where its replies fit), so no prompt is
    split across passes and each pass bounds its activations as a micro-batch of the
    update does. Every reply needs at least one token.
    """
    n = len(prompts)
    if n != len(replies) or n == 0 or any(len(r) == 0 for r in replies):
        raise ValueError("cross_scores needs as many non-empty replies as prompts (N >= 1)")
    prompts, prompt_index = distinct(prompts)
    replies, reply_index = distinct(replies)
    p, r = len(prompts), len(replies)
    per_pass = max(1, max_rows // r)  # prompts per pass
    out = torch.zeros(p, r, dtype=torch.float64)
    for first in range(0, p, per_pass):
        rows = range(first, min(first + per_pass, p))
        pair_prompts = [prompts[i] for i in rows for _ in range(r)]
        pair_replies = [replies[j] for _ in rows for j in range(r)]
        scores = reply_logprobs(model, pair_prompts, pair_replies, temperature, pad_token_id)
        out[first : rows.stop] = scores.view(len(rows), r)
    return out[prompt_index][:, reply_index]


def distinct(sequences: Sequence[Sequence[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """The distinct token sequences in order of first appearance, and (N,) the index of
    each input among them."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(seq), len(first)) for seq in sequences]
    return [list(seq) for seq in first], torch.tensor(index, dtype=torch.long)
