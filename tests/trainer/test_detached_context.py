"""optim.detach_context: the forward's values are the exact path's; its gradient is
exactly that of a full forward whose keys and values at the unread positions are
constants (the definition, built here with hooks on every k_proj and v_proj); a row's
gradient does not depend on its micro-batch; and the approximation really differs from
the exact gradient (so the comparisons above are not between two identical paths)."""

from __future__ import annotations

import pytest
import torch

from starpo.compute import forward
from starpo.compute.batch import TrainBatch
from starpo.compute.detached_context import read_rows
from starpo.errors import UserError
from starpo.models import tiny_random_model


def dialogue_batch(prefix: int, rows: int = 4, turns: int = 3) -> TrainBatch:
    """Rows sharing a `prefix`-token prompt, then `turns` x (observation, reply) of their
    own lengths; the replies are agent tokens. The rows differ in length (right padding)."""
    g = torch.Generator().manual_seed(3)
    seqs, masks = [], []
    for row in range(rows):
        ids = torch.randint(10, 5000, (prefix,), generator=torch.Generator().manual_seed(7))
        mask = torch.zeros(prefix)
        for turn in range(turns):
            observation = torch.randint(10, 5000, (5 + (row + turn) % 4,), generator=g)
            reply = torch.randint(10, 5000, (2 + (row * turn) % 3,), generator=g)
            ids = torch.cat([ids, observation, reply])
            mask = torch.cat([mask, torch.zeros(len(observation)), torch.ones(len(reply))])
        seqs.append(ids)
        masks.append(mask)
    width = max(len(s) for s in seqs)
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width)
    for row, (ids, mask) in enumerate(zip(seqs, masks, strict=True)):
        input_ids[row, : len(ids)], attention[row, : len(ids)] = ids, 1
        loss_mask[row, : len(ids)] = mask
    return TrainBatch.for_scoring(input_ids, attention, loss_mask)


def _loss_and_grads(model, batch: TrainBatch, detach: bool):
    model.zero_grad(set_to_none=True)
    logprobs, entropy = forward.policy_logprobs(model, batch, 0.8, detach_context=detach)
    (0.7 * logprobs.sum() + 0.3 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def _constant_unread_keys_and_values(model, batch: TrainBatch):
    """Hooks making every layer's keys and values constants at the positions no row reads
    (the definition of the approximation), on a plain full forward."""
    targets = torch.nonzero(batch.loss_mask.any(dim=0)).squeeze(1)
    positions = targets[targets > 0] - 1
    read_at = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    read_at[:, positions] = read_rows(batch, positions)

    def hook(module, inputs, out):
        return torch.where(read_at[..., None], out, out.detach())

    return [
        getattr(layer.self_attn, name).register_forward_hook(hook)
        for layer in model.model.layers
        for name in ("k_proj", "v_proj")
    ]


def _assert_close(got, want, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=atol, msg="logprobs")
    torch.testing.assert_close(got[1], want[1], rtol=rtol, atol=atol, msg="entropy")
    assert got[2].keys() == want[2].keys()
    for name, grad in want[2].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(got[2][name], grad, rtol=1e-4, atol=1e-4 * scale, msg=name)


@pytest.mark.parametrize("prefix", [24, 0], ids=["shared-prompt", "no-shared-prompt"])
def test_the_gradient_is_that_of_constant_context_keys_and_values(monkeypatch, prefix):
    model, _ = tiny_random_model(seed=1)
    batch = dialogue_batch(prefix)
    got = _loss_and_grads(model, batch, detach=True)
    hooks = _constant_unread_keys_and_values(model, batch)
    with monkeypatch.context() as patch:  # the plain padded forward, no prefix sharing
        patch.setattr(forward, "MIN_SHARED_PREFIX", 10**9)
        want = _loss_and_grads(model, batch, detach=False)
    for handle in hooks:
        handle.remove()
    _assert_close(got, want)


def test_values_are_exact_and_the_gradient_is_an_approximation():
    model, _ = tiny_random_model(seed=1)
    batch = dialogue_batch(24)
    approx = _loss_and_grads(model, batch, detach=True)
    exact = _loss_and_grads(model, batch, detach=False)
    torch.testing.assert_close(approx[0], exact[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(approx[1], exact[1], rtol=1e-5, atol=1e-5)
    flat = [torch.cat([g[n].flatten() for n in sorted(exact[2])]) for g in (approx[2], exact[2])]
    relative = float((flat[0] - flat[1]).norm() / flat[1].norm())
    assert relative > 1e-3  # the context's terms are really dropped


def test_a_rows_gradient_does_not_depend_on_its_micro_batch():
    model, _ = tiny_random_model(seed=1)
    batch = dialogue_batch(24)
    together = _loss_and_grads(model, batch, detach=True)
    summed: dict[str, torch.Tensor] = {}
    for row in range(len(batch)):
        _, _, grads = _loss_and_grads(model, batch.select([row]), detach=True)
        for name, grad in grads.items():
            summed[name] = summed.get(name, 0) + grad
    for name, grad in together[2].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(summed[name], grad, rtol=1e-4, atol=1e-4 * scale, msg=name)


def test_without_autograd_it_is_the_exact_forward():
    model, _ = tiny_random_model(seed=1)
    batch = dialogue_batch(24)
    with torch.no_grad():
        got, _ = forward.policy_logprobs(model, batch, 0.8, detach_context=True)
        want, _ = forward.policy_logprobs(model, batch, 0.8)
    assert torch.equal(got, want)


def test_a_model_without_a_plain_head_gets_a_clear_error(monkeypatch):
    model, _ = tiny_random_model(seed=1)
    monkeypatch.setattr(forward, "plain_head_weight", lambda model: None)
    with pytest.raises(UserError, match="optim.detach_context=false"):
        forward.policy_logprobs(model, dialogue_batch(24), 0.8, detach_context=True)


def test_gradient_checkpointing_changes_nothing():
    # The layers recompute in backward; pass 2 appends to the context's cache once.
    from starpo.compute.activation_checkpointing import enable_gradient_checkpointing

    batch = dialogue_batch(24)
    model, _ = tiny_random_model(seed=1)
    plain = _loss_and_grads(model, batch, detach=True)
    enable_gradient_checkpointing(model)
    _assert_close(_loss_and_grads(model, batch, detach=True), plain)
