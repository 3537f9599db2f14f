"""The update's FLOP count (`trainer.flops`) against the matmuls torch actually runs.

`MatmulCounter` sees every matmul op a forward dispatches, with its shapes (forwards
without gradients: a backward's two matmuls per forward matmul are the documented factor
`WITH_BACKWARD`). The linear layers and the LM head run as `mm`/`addmm`, eager attention
as `bmm`s over the full query x key rectangle (masked pairs and padding included). So the
linear part is compared exactly, and attention against its bound: the useful causal
pairs `flops` counts are never more than what the kernels computed.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_update_speed import GROUP_SIZE, config, grouped_batch
from torch.utils._python_dispatch import TorchDispatchMode

from starpo.compute import flops, forward
from starpo.compute.batch import TrainBatch
from starpo.models import tiny_random_model
from starpo.trainer import prepare, update
from starpo.trainer.optim import build_optimizers
from starpo.trainer.train_models import build_models
from starpo.trainer.update_settings import UpdateSettings

LINEAR_OPS = ("mm", "addmm")


class MatmulCounter(TorchDispatchMode):
    """2 x m x k x n of every mm / addmm / bmm dispatched (by op name), from the shapes of
    the operands as the kernel receives them."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "bmm"):
            a, b = args[-2], args[-1]  # addmm: (bias, a, b)
            batch = a.shape[0] if name == "bmm" else 1
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            self.flops[name] = self.flops.get(name, 0) + 2 * batch * m * k * n
        return func(*args, **(kwargs or {}))


def counted(run) -> dict[str, int]:
    """Matmul FLOPs by op name of everything `run()` computes."""
    with MatmulCounter() as counter:
        run()
    return counter.flops


def linear_flops(shape: flops.Shape, size: flops.PassSize, factor: int) -> float:
    """The linear layers' and LM head's share of a counted pass (no attention)."""
    decoder = flops.decoder_flops(shape, size.tokens, pairs=0)
    return factor * (decoder + flops.head_flops(shape, size.head_rows))


@torch.no_grad()
def policy_pass(model, batch: TrainBatch) -> None:
    """The forward of the update's actor loss: policy log-probs."""
    forward.policy_logprobs(model, batch, 1.0, with_entropy=False)


@pytest.fixture
def model():
    model, _ = tiny_random_model(seed=1)
    model.config._attn_implementation = "eager"  # attention as counted bmm ops
    return model


def test_hand_counted_pairs_and_layer_flops():
    # Prefix of 4 (10 causal pairs), tails of 2 and 3: each tail token sees the 4 prefix
    # tokens and its tail up to itself: 2*4 + 3 and 3*4 + 6.
    assert flops.causal_pairs(4, torch.tensor([2, 3])) == 10 + (8 + 3) + (12 + 6)
    shape = flops.Shape(hidden=8, intermediate=16, layers=2, kv_hidden=4, vocab=100)
    assert shape.layer_weights == 2 * 64 + 2 * 32 + 3 * 128
    assert flops.decoder_flops(shape, tokens=5, pairs=7) == 2 * (2 * 576 * 5 + 4 * 8 * 7)
    assert flops.head_flops(shape, rows=3) == 2 * 8 * 100 * 3


@pytest.mark.parametrize("path", ["plain", "shared-cache", "packed"])
def test_counted_linear_flops_equal_the_matmuls_torch_runs(monkeypatch, model, path):
    batch = grouped_batch().select(torch.arange(GROUP_SIZE))  # one group: a shared prompt
    if path == "plain":  # no common prefix: every row padded to the widest
        batch.input_ids[:, 0] = torch.arange(10, 10 + GROUP_SIZE)
    monkeypatch.setattr(forward, "PACKING", "always" if path == "packed" else "never")
    size = flops.training_pass(model, batch, factor=1)
    shape = flops.model_shape(model)
    ops = counted(lambda: policy_pass(model, batch))

    linear = sum(ops.get(op, 0) for op in LINEAR_OPS)
    assert linear == linear_flops(shape, size, 1)
    assert size.head_rows == len(batch) * (int(batch.loss_mask.any(dim=0).sum()))
    attention = size.flops - linear
    assert 0 < attention <= sum(n for op, n in ops.items() if op not in LINEAR_OPS)
    rows, width = batch.input_ids.shape
    real = int(batch.attention_mask.sum())
    prefix = 0 if path == "plain" else forward.shared_prefix_length(batch)
    assert size.real_tokens == real - (rows - 1) * prefix  # the shared prompt once
    if path == "packed":
        assert size.tokens == size.real_tokens  # packing runs no padding
    else:
        assert size.tokens == prefix + rows * (width - prefix)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-prompt", "no-shared-prompt"])
def test_detached_context_counts_the_matmuls_it_runs(model, shared):
    # optim.detach_context: every token forward once (the prompt once), then the read
    # positions again with autograd (their forward is what the counter sees).
    batch = grouped_batch().select(torch.arange(GROUP_SIZE))
    if not shared:
        batch.input_ids[:, 0] = torch.arange(10, 10 + GROUP_SIZE)
    size = flops.detached_context_pass(model, batch, factor=1)
    ops = counted(lambda: forward.policy_logprobs(model, batch, 1.0, False, detach_context=True))
    shape = flops.model_shape(model)
    assert sum(ops.get(op, 0) for op in LINEAR_OPS) == linear_flops(shape, size, 1)
    rows, width = batch.input_ids.shape
    read = int(batch.loss_mask.any(dim=0)[1:].sum())
    prefix = forward.shared_prefix_length(batch) if shared else 0
    assert size.head_rows == rows * read
    assert size.tokens == prefix + rows * (width - prefix) + rows * read
    assert 0 < size.flops - linear_flops(shape, size, 1)  # and attention


def test_packed_prompts_count_each_prompt_once_and_the_padding_they_run(monkeypatch, model):
    batch = grouped_batch().select(torch.arange(2 * GROUP_SIZE))  # two groups, two prompts
    monkeypatch.setattr(forward, "PACKING", "always")
    plan = forward.forward_plan(model, batch)
    assert plan.kind == "packed" and len(plan.clusters) == 2
    size = flops.training_pass(model, batch, factor=1)
    ops = counted(lambda: policy_pass(model, batch))
    assert sum(ops.get(op, 0) for op in LINEAR_OPS) == linear_flops(
        flops.model_shape(model), size, 1
    )
    real = int(batch.attention_mask.sum())
    assert size.real_tokens == real - sum((len(c.rows) - 1) * c.prefix for c in plan.clusters)
    packed = forward.pack_rows(batch, plan.clusters)
    assert size.tokens == packed.ids.numel()  # both sequences, padded to the longer


def test_the_update_reports_the_flops_of_its_passes(model):
    """`ppo_update`'s perf/update_flops is the FLOPs of the passes it ran: one mini-batch
    of two micro-batches (one group each), both epochs, all with gradients (the rollout's
    old log-probs: no recompute forward)."""
    cfg = config(
        mini=8,
        micro=4,
        epochs=2,
        **{"algorithm.recompute_old_logprobs": "false", "algorithm.tis_cap": "null"},
    )
    models = build_models(cfg, model, None)
    optimizers = build_optimizers(cfg, models.actor, models.critic)
    batch = grouped_batch()
    prepare.prepare(batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=False)
    generator = torch.Generator().manual_seed(0)
    metrics = update.ppo_update(batch, models, optimizers, UpdateSettings.of(cfg), generator)
    micros = [batch.select(torch.arange(g * 4, g * 4 + 4)) for g in range(2)]
    one_epoch = sum(flops.training_pass(models.actor, micro).flops for micro in micros)
    assert metrics[update.UPDATE_FLOPS] == pytest.approx(2 * one_epoch)


def test_lora_and_critic_passes_count_what_they_train(model):
    batch = grouped_batch().select(torch.arange(GROUP_SIZE))
    full = flops.training_pass(model, batch)
    frozen = flops.training_pass(model, batch, factor=flops.WITH_FROZEN_BACKWARD)
    assert frozen.flops == pytest.approx(full.flops * 2 / 3)
    critic = flops.critic_pass(model.get_decoder(), batch)  # the decoder as the actor runs it
    assert critic.tokens == full.tokens and critic.head_rows == 0
    head = flops.head_flops(flops.model_shape(model), full.head_rows)
    assert critic.flops == pytest.approx(full.flops - flops.WITH_BACKWARD * head)


def test_a_model_of_unknown_shape_is_not_counted():
    class Odd(torch.nn.Module):
        config = object()

    assert flops.model_shape(Odd()) is None
    assert flops.training_pass(Odd(), grouped_batch()) is None


def test_the_peak_is_measured_once_and_shares_follow_from_it():
    peak = flops.matmul_peak(torch.float32, "cpu")
    assert math.isfinite(peak) and peak > 0
    assert flops.matmul_peak(torch.float32, "cpu") == peak  # cached for the process
    assert flops.utilisation(2e9, 2.0, 4.0) == {"gflops": 1.0, "peak_share": 0.25}
    assert flops.utilisation(0.0, 2.0, 4.0) == {}


def test_measuring_the_matmul_peak_leaves_the_global_rng_alone():
    # Measured once per process at a run's first update: drawing its operands from the
    # global RNG made a run's RNG state depend on whether an earlier run in the same
    # process had measured it (async and sync checkpoints then differed).
    from starpo.compute.flops import measure_matmul_peak

    torch.manual_seed(7)
    before = torch.get_rng_state()
    assert measure_matmul_peak(torch.float32) > 0
    assert torch.equal(torch.get_rng_state(), before)
