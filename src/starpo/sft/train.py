"""Supervised fine-tuning on replayed trajectories: NLL of the agent's tokens.

    loss(batch) = - sum_{agent tokens i in batch} log p(x_i | x_<i) / N_batch

N_batch counts the agent tokens (loss_mask 1) of the whole optimizer batch, so splitting a
batch into micro-batches (gradient accumulation) changes neither the loss nor its gradient:
each micro-batch adds its token sum / N_batch. (A mean of micro-batch means would weight a
token by the size of the micro-batch it happened to land in.)

The forward is the trainer's too (`starpo.compute`): `hidden_at` encodes a prompt shared
by the rows once and runs the decoder without its LM head, and `head_logprobs` turns hidden
states into log-probs in vocabulary slabs, for agent tokens only, never holding (tokens,
vocab) logits.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from starpo.algorithms import head_logprobs, token_logprobs
from starpo.compute import flops
from starpo.compute.batch import TrainBatch, build_batch
from starpo.compute.forward import hidden_at, logits_at, plain_head_weight
from starpo.compute.lr_schedule import lr_multiplier
from starpo.models.precision import Precision, compute_dtype, precision_for
from starpo.sft.options import TrainOptions
from starpo.types import Trajectory

#: Hidden states scored against the whole vocabulary at once for token accuracy
#: (256 x 49k fp32 logits = 48 MiB for SmolLM2).
ARGMAX_ROWS = 256
FP32 = Precision()  # no autocast


# ----------------------------------------------------------------------------- data


def split_validation(
    examples: Sequence[Trajectory], fraction: float, seed: int
) -> tuple[list[int], list[int]]:
    """(train, validation) indices. Whole seeds go to one side (several samples of one
    seed share their initial state), about `fraction` of them, at least one when
    `fraction` > 0 and there are two seeds or more."""
    keys = sorted({(t.env_id, t.seed) for t in examples})
    random.Random(seed).shuffle(keys)
    count = round(fraction * len(keys))
    count = min(max(count, 1 if fraction > 0 else 0), len(keys) - 1)
    held = set(keys[:count])
    val = [i for i, t in enumerate(examples) if (t.env_id, t.seed) in held]
    train = [i for i, t in enumerate(examples) if (t.env_id, t.seed) not in held]
    return train, val


def agent_tokens(example: Trajectory) -> int:
    return sum(example.loss_mask)


def _micro_batches(
    model: nn.Module, examples: Sequence[Trajectory], size: int, pad_token_id: int
) -> Iterator[TrainBatch]:
    """`examples` in padded batches of `size` on the model's device, similar lengths side
    by side: less padding, same sums (the loss is a sum over tokens)."""
    device = next(model.parameters()).device
    ordered = sorted(examples, key=lambda t: len(t.token_ids))
    for first in range(0, len(ordered), size):
        chunk = ordered[first : first + size]
        yield build_batch(chunk, pad_token_id, per_turn_rewards=False).to(device)


# ----------------------------------------------------------------------------- math


def _argmax_tokens(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """argmax_v (h W^T)_v per row of hidden (N, H), a few hundred rows at a time."""
    if not len(hidden):
        return torch.zeros(0, dtype=torch.long, device=hidden.device)
    return torch.cat([(rows @ weight.T).argmax(dim=-1) for rows in hidden.split(ARGMAX_ROWS)])


def agent_token_scores(model: nn.Module, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs (N,), hits (N,)) of the N agent tokens of `batch` (row-major order): the
    model's log-prob of each, and whether it is the model's most likely next token."""
    mask = batch.loss_mask.bool()
    positions = torch.nonzero(mask.any(dim=0)).squeeze(1)  # (K,) columns with agent tokens
    positions = positions[positions > 0]  # token 0 has no prediction
    picked = mask[:, positions]  # (B, K) which of those are this row's agent tokens
    labels = batch.input_ids[:, positions][picked]  # (N,)
    weight = plain_head_weight(model)
    if weight is None:  # a head with extras: the model's own forward and full logits
        logits = logits_at(model, batch, positions - 1)[picked].float()  # (N, V)
        return token_logprobs(logits, labels), logits.argmax(dim=-1) == labels
    hidden = hidden_at(model, batch, positions - 1)[picked]  # (N, H), agent tokens only
    logprobs, _ = head_logprobs(hidden, weight, labels, with_entropy=False)
    with torch.no_grad():
        hits = _argmax_tokens(hidden.detach(), weight.detach()) == labels
    return logprobs, hits


def turn_matches(loss_mask: torch.Tensor, hits: torch.Tensor) -> tuple[int, int]:
    """(turns whose every agent token is a hit, turns). A turn is a run of consecutive agent
    tokens in a row of `loss_mask` (B, T); `hits` (N,) are `agent_token_scores`' hits, in
    the same row-major order (token 0 has no prediction and is never an agent token there).

    Token accuracy flatters a policy: the answer's tags are easy and most of its tokens, so
    it can look high while the action itself is a guess. A turn hit means the model's
    greedy reply, teacher-forced, is exactly the example's."""
    mask = loss_mask.bool().clone()
    mask[:, 0] = False
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    turns = int(starts.sum())
    if turns == 0:
        return 0, 0
    turn_of = torch.cumsum(starts.flatten().long(), 0)[mask.flatten()] - 1  # (N,)
    misses = torch.zeros(turns, dtype=torch.long, device=hits.device)
    misses.index_add_(0, turn_of.to(hits.device), (~hits).long())
    return int((misses == 0).sum()), turns


@dataclass
class Totals:
    """Sums over agent tokens (-log-prob, hits, count), over turns (exact, count), and the
    FLOPs of the training passes (`compute.flops`; 0 in evaluation)."""

    nll: float = 0.0
    hits: int = 0
    tokens: int = 0
    turn_hits: int = 0
    turns: int = 0
    flops: float = 0.0

    def add(self, logprobs: torch.Tensor, hits: torch.Tensor, loss_mask: torch.Tensor) -> None:
        self.nll -= float(logprobs.detach().sum())
        self.hits += int(hits.sum())
        self.tokens += len(hits)
        exact, turns = turn_matches(loss_mask, hits)
        self.turn_hits += exact
        self.turns += turns

    def merge(self, other: Totals) -> None:
        self.nll += other.nll
        self.hits += other.hits
        self.tokens += other.tokens
        self.turn_hits += other.turn_hits
        self.turns += other.turns
        self.flops += other.flops

    @property
    def loss(self) -> float:
        return self.nll / self.tokens if self.tokens else math.nan

    @property
    def accuracy(self) -> float:
        return self.hits / self.tokens if self.tokens else math.nan

    @property
    def turn_accuracy(self) -> float:
        return self.turn_hits / self.turns if self.turns else math.nan


def accumulate_gradients(
    model: nn.Module,
    examples: Sequence[Trajectory],
    micro_batch_size: int,
    pad_token_id: int,
    precision: Precision = FP32,
) -> Totals:
    """Backward of the batch loss (module docstring) through micro-batches of
    `micro_batch_size` examples, adding to the parameters' `.grad`; returns the sums."""
    total = sum(agent_tokens(t) for t in examples)
    totals = Totals()
    for batch in _micro_batches(model, examples, micro_batch_size, pad_token_id):
        with precision.autocast():
            logprobs, hits = agent_token_scores(model, batch)
        (-logprobs.float().sum() / max(total, 1)).backward()
        totals.add(logprobs, hits, batch.loss_mask)
        totals.flops += _pass_flops(model, batch, agent_rows=len(hits))
    return totals


def _pass_flops(model: nn.Module, batch: TrainBatch, agent_rows: int) -> float:
    """FLOPs of `agent_token_scores`' training pass (`compute.flops`): the LM head on the
    agent tokens' rows through the hidden-state head, else at every row and position the
    model's own logits run (`logits_at`, the trainer's default); 0 for an unknown shape."""
    head_rows = agent_rows if plain_head_weight(model) is not None else None
    size = flops.training_pass(model, batch, head_rows=head_rows)
    return size.flops if size is not None else 0.0


@torch.no_grad()
def evaluate(
    model: nn.Module,
    examples: Sequence[Trajectory],
    micro_batch_size: int,
    pad_token_id: int,
    precision: Precision = FP32,
) -> Totals:
    """Agent-token NLL and accuracy of `examples` (no gradients)."""
    was_training = model.training
    model.eval()
    totals = Totals()
    for batch in _micro_batches(model, examples, micro_batch_size, pad_token_id):
        with precision.autocast():
            totals.add(*agent_token_scores(model, batch), batch.loss_mask)
    model.train(was_training)
    return totals


# ----------------------------------------------------------------------------- loop


def make_optimizer(
    model: nn.Module, options: TrainOptions, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over every weight, with warm-up then constant or cosine (the trainer's
    `lr_multiplier`)."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=options.lr,
        weight_decay=options.weight_decay,
    )
    warmup = round(options.warmup_ratio * total_steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(
            step, warmup=warmup, total=total_steps, schedule=options.schedule
        ),
    )
    return optimizer, schedule


def train_epochs(
    model: nn.Module,
    train: Sequence[Trajectory],
    val: Sequence[Trajectory],
    options: TrainOptions,
    pad_token_id: int,
    *,
    progress: Callable[[int, int], object] | None = None,
    say: Callable[[str], None] = lambda _line: None,
) -> list[dict[str, float]]:
    """Train for `options.epochs` epochs; one metrics dict per epoch (epoch 0: before
    training, validation only). `progress(epoch, steps)` returns a tqdm-like bar or None."""
    torch.manual_seed(options.seed)
    device = next(model.parameters()).device
    precision = precision_for(compute_dtype(options.dtype, device), device)
    steps_per_epoch = math.ceil(len(train) / options.batch_size)
    optimizer, schedule = make_optimizer(model, options, steps_per_epoch * options.epochs)
    params = [p for p in model.parameters() if p.requires_grad]
    history = []
    if val:
        before = evaluate(model, val, options.micro_batch_size, pad_token_id, precision)
        history.append({"epoch": 0, **_val_metrics(before)})
        say(
            f"before SFT: val loss {before.loss:.4f}, val token accuracy {before.accuracy:.1%}, "
            f"val turn accuracy {before.turn_accuracy:.1%}"
        )
    order = random.Random(options.seed)
    model.train()
    for epoch in range(1, options.epochs + 1):
        started = time.perf_counter()
        shuffled = list(train)
        order.shuffle(shuffled)
        bar = progress(epoch, steps_per_epoch) if progress else None
        totals, grad_norms = Totals(), []
        for first in range(0, len(shuffled), options.batch_size):
            batch = shuffled[first : first + options.batch_size]
            step = accumulate_gradients(
                model, batch, options.micro_batch_size, pad_token_id, precision
            )
            grad_norms.append(_clip(params, options.max_grad_norm))
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            totals.merge(step)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{step.loss:.3f}", refresh=False)
        if bar is not None:
            bar.close()
        seconds = time.perf_counter() - started
        row = _epoch_row(epoch, totals, grad_norms, seconds, shuffled, schedule)
        row.update(_utilisation(totals.flops, seconds, model, precision))
        if val:
            after = evaluate(model, val, options.micro_batch_size, pad_token_id, precision)
            row.update(_val_metrics(after))
        history.append(row)
        say(format_epoch(row, options.epochs))
    model.eval()
    return history


def _clip(params: list[nn.Parameter], max_norm: float) -> float:
    """The gradient norm before clipping (clipped to `max_norm` when it is > 0)."""
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    grads = [p.grad.norm() for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0


def _utilisation(work: float, seconds: float, model: nn.Module, precision: Precision) -> dict:
    """The epoch's training GFLOP/s and share of the matmul peak in the dtype it computes
    in (`compute.flops`, the figure the trainer logs as perf/update_peak_share)."""
    peak, dtype = flops.peak_of(model, precision)
    speed = flops.utilisation(work, seconds, peak)
    return {**speed, "matmul_peak_gflops": peak, "dtype": str(dtype).removeprefix("torch.")}


def _val_metrics(totals: Totals) -> dict[str, float]:
    return {
        "val_loss": totals.loss,
        "val_accuracy": totals.accuracy,
        "val_turn_accuracy": totals.turn_accuracy,
    }


def _epoch_row(epoch, totals: Totals, grad_norms, seconds, examples, schedule) -> dict:
    tokens = sum(len(t.token_ids) for t in examples)
    return {
        "epoch": epoch,
        "train_loss": totals.loss,
        "train_accuracy": totals.accuracy,
        "train_turn_accuracy": totals.turn_accuracy,
        "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
        "lr": schedule.get_last_lr()[0],
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
        "agent_tokens_per_s": totals.tokens / seconds if seconds > 0 else math.nan,
    }


def format_epoch(row: dict[str, float], epochs: int) -> str:
    """One console line for an epoch."""
    line = (
        f"epoch {row['epoch']}/{epochs}: train loss {row['train_loss']:.4f}, "
        f"token accuracy {row['train_accuracy']:.1%}, "
        f"turn accuracy {row['train_turn_accuracy']:.1%}"
    )
    if "val_loss" in row:
        line += (
            f"; val loss {row['val_loss']:.4f}, val token accuracy {row['val_accuracy']:.1%}, "
            f"val turn accuracy {row['val_turn_accuracy']:.1%}"
        )
    line += f"; {row['seconds']:.1f} s, {row['tokens_per_s']:.0f} tokens/s"
    if "peak_share" in row:
        line += (
            f", {row['gflops']:.1f} GFLOP/s = {row['peak_share']:.0%} of the "
            f"{row['dtype']} matmul peak ({row['matmul_peak_gflops']:.1f})"
        )
    return line
