"""The critic runs its backbone as the actor's forward does (a shared prompt encoded once,
packed or through a KV cache): its values at agent tokens, and their gradients, must not
change with the path, against the plainest reference (each padded row run whole)."""

from __future__ import annotations

import pytest
import torch
from test_update_speed import GROUP_SIZE, grouped_batch

from starpo.compute import flops, forward
from starpo.compute.batch import TrainBatch
from starpo.models import tiny_random_model
from starpo.trainer.train_models import ValueModel


def _critic() -> ValueModel:
    model, _ = tiny_random_model(seed=3)
    critic = ValueModel(model.model, model.config.hidden_size)
    with torch.no_grad():  # zero-initialised otherwise: every value would be 0
        critic.value_head.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
        critic.value_head.bias.fill_(0.5)
    return critic


def _whole_rows(critic: ValueModel, batch: TrainBatch) -> torch.Tensor:
    """The reference: every padded row through the backbone whole; the value of token t
    is the head on the hidden state at t - 1."""
    out = critic.backbone(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    )
    values = critic.value_head(out.last_hidden_state.float()).squeeze(-1)
    return torch.cat([torch.zeros_like(values[:, :1]), values[:, :-1]], dim=1)


def _batch(kind: str) -> TrainBatch:
    batch = grouped_batch()
    if kind == "one group":  # one shared prompt: a KV cache or one packed sequence
        return batch.select(torch.arange(GROUP_SIZE))
    if kind == "no shared prompt":
        batch = batch.select(torch.arange(GROUP_SIZE))
        batch.input_ids[:, 0] = torch.arange(10, 10 + GROUP_SIZE)
    return batch  # several groups: one packed sequence per prompt


@pytest.mark.parametrize("packing", ["auto", "always", "never"])
@pytest.mark.parametrize("kind", ["groups", "one group", "no shared prompt"])
def test_values_and_gradients_match_each_row_run_whole(kind, packing, monkeypatch):
    monkeypatch.setattr(forward, "PACKING", packing)
    batch = _batch(kind)
    mask = batch.loss_mask
    plan = forward.forward_plan(_critic().backbone, batch).kind
    if kind == "no shared prompt":
        assert plan == "plain"
    elif packing == "always":
        assert plan == "packed"
    elif packing == "never":
        assert plan == ("cache" if kind == "one group" else "plain")

    grads = []
    for run in (lambda c: c(batch), lambda c: _whole_rows(c, batch)):
        critic = _critic()
        values = run(critic) * mask
        (values * torch.linspace(-1, 1, values.shape[1])).sum().backward()
        grads.append({n: p.grad for n, p in critic.named_parameters() if p.grad is not None})
        if len(grads) == 1:
            got = values.detach()
    torch.testing.assert_close(got, values.detach(), atol=1e-5, rtol=1e-4)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 2
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-4, rtol=1e-3)


def test_positions_no_row_trains_on_are_zero():
    batch = _batch("groups")
    with torch.no_grad():
        values = _critic()(batch)
    trained = batch.loss_mask.any(dim=0)
    assert values[:, ~trained].abs().max() == 0
    assert values[batch.loss_mask.bool()].abs().min() > 0  # the bias alone makes them 0.5-ish


def test_a_shared_prompt_is_counted_once():
    """The FLOPs counted for the critic follow its plan: a group's prompt once."""
    batch = _batch("one group")
    critic = _critic()
    shape = flops.model_shape(critic.backbone)
    counted = flops.critic_pass(critic.backbone, batch)
    rows, width = batch.input_ids.shape
    assert counted.tokens < rows * width / 2  # the prompt is most of every row
    assert counted.flops == pytest.approx(
        flops.decoder_pass(critic.backbone, shape, batch).flops * flops.WITH_BACKWARD
    )
