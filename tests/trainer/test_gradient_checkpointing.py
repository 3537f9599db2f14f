"""model.gradient_checkpointing: the same outputs and gradients, far fewer activations kept.

The models stay in eval mode (no dropout) and the shared-prefix forward keeps passing its KV
cache from the prompt to the rows, so both paths of `forward.logits_at` are checked.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from starpo.compute import activation_checkpointing as checkpointing
from starpo.compute import forward
from starpo.compute.batch import TrainBatch
from starpo.config import load_config
from starpo.models import tiny_random_model
from starpo.trainer.train_models import TrainModels, build_models

# Wide layers and a long sequence with few agent tokens: the decoder layers' activations,
# not the (tokens x vocab) logits, dominate what the forward keeps for backward.
SHAPE = {"num_layers": 6, "hidden_size": 128, "intermediate_size": 512}


def _models(checkpointing_on: bool, lora: bool = False, **shape: int) -> TrainModels:
    """Actor and critic as the trainer builds them, from the same weights every time."""
    actor, tokenizer = tiny_random_model(seed=1, **shape)
    on, lora_on = str(checkpointing_on).lower(), str(lora).lower()
    overrides = [
        "algorithm.adv_estimator=gae",  # a critic too
        f"model.gradient_checkpointing={on}",
        f"model.lora.enabled={lora_on}",
        "model.lora.rank=4",
    ]
    torch.manual_seed(0)  # the same LoRA adapters in every build
    models = build_models(load_config(None, overrides), actor, tokenizer)
    with torch.no_grad():  # the zero-initialised value head would hide the backbone's gradients
        head = models.critic.value_head.weight
        head.copy_(torch.randn(head.shape, generator=torch.Generator().manual_seed(2)))
    return models


def _actor_loss(models: TrainModels, batch: TrainBatch) -> torch.Tensor:
    logprobs, entropy = forward.policy_logprobs(models.actor, batch, temperature=0.8)
    return logprobs.sum() + entropy.sum()


def _critic_loss(models: TrainModels, batch: TrainBatch) -> torch.Tensor:
    values = models.critic(batch)
    return (values * batch.loss_mask).square().sum()


def _grads(models: TrainModels) -> dict[str, torch.Tensor]:
    named = [
        *models.actor.named_parameters(prefix="actor"),
        *models.critic.named_parameters(prefix="critic"),
    ]
    return {name: p.grad.clone() for name, p in named if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("prefix", [40, 0], ids=["shared-prefix", "no-shared-prefix"])
def test_checkpointing_keeps_losses_and_gradients(prefix: int, lora: bool, prompt_batch):
    batch = prompt_batch(prefix, 24, first_turn=3, last_agent=6)
    shared = forward.shared_prefix_length(batch) >= forward.MIN_SHARED_PREFIX
    assert shared == (prefix > 0)  # both paths of logits_at are taken
    results = []
    for on in (False, True):
        models = _models(on, lora, num_layers=3)
        losses = torch.stack([_actor_loss(models, batch), _critic_loss(models, batch)])
        losses.sum().backward()
        results.append((losses.detach(), _grads(models)))
    (losses_off, grads_off), (losses_on, grads_on) = results
    torch.testing.assert_close(losses_on, losses_off, rtol=1e-6, atol=0)
    assert grads_on.keys() == grads_off.keys()
    assert any(name.startswith("critic.backbone") for name in grads_off)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, rtol=1e-5, atol=1e-8, msg=name)


def _bytes_kept_for_backward(
    models: TrainModels,
    loss_fn: Callable[[TrainModels, TrainBatch], torch.Tensor],
    batch: TrainBatch,
    monkeypatch,
) -> int:
    """Bytes of activations a forward keeps until backward, parameters left out: every
    tensor autograd saves (the inputs of checkpointed layers included), plus the KV-cache
    copies checkpointed layers keep for their replay. Shared storage counts once."""
    params = {p.untyped_storage().data_ptr() for p in models.actor.parameters()}
    params |= {p.untyped_storage().data_ptr() for p in models.critic.parameters()}
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    copy_cache = checkpointing._copy_cache

    def counted_copy(cache):
        copied = copy_cache(cache)
        for layer in copied.layers:
            for value in vars(layer).values():
                if isinstance(value, torch.Tensor):
                    keep(value)
        return copied

    with monkeypatch.context() as patch:
        patch.setattr(checkpointing, "_copy_cache", counted_copy)
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            loss = loss_fn(models, batch)
    loss.backward()  # the replay in backward must work too
    return sum(kept.values())


@pytest.mark.parametrize(
    ("model", "prefix"),
    [("actor", 96), ("actor", 0), ("critic", 0)],  # the critic has no shared-prefix path
    ids=["actor-shared-prefix", "actor-no-shared-prefix", "critic"],
)
def test_checkpointing_keeps_far_fewer_activations(
    model: str, prefix: int, monkeypatch, prompt_batch
):
    batch = prompt_batch(prefix, 64, first_turn=3, last_agent=2)
    loss = {"actor": _actor_loss, "critic": _critic_loss}[model]
    kept = {}
    for on in (False, True):
        models = _models(on, **SHAPE)
        kept[on] = _bytes_kept_for_backward(models, loss, batch, monkeypatch)
    assert kept[True] < 0.5 * kept[False], kept
