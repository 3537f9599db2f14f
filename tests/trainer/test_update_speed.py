"""The update's shortcuts change no result: old log-probs taken from the first mini-batch's
own forward instead of a recompute, micro-batch sizes, the fused AdamW step."""

from __future__ import annotations

import pytest
import torch

from starpo.compute.batch import TrainBatch
from starpo.config import load_config
from starpo.models import tiny_random_model
from starpo.trainer import prepare, update
from starpo.trainer.optim import build_optimizers, fused_adamw_supported
from starpo.trainer.train_models import build_models
from starpo.trainer.update_settings import UpdateSettings

GROUPS, GROUP_SIZE, PROMPT = 2, 4, 24


def grouped_batch(seed: int = 0) -> TrainBatch:
    """GROUPS groups of GROUP_SIZE rows: a PROMPT-token prompt per group, then 3 to 9 agent
    tokens per row (right padded), one turn, random rewards and rollout log-probs."""
    g = torch.Generator().manual_seed(seed)
    rows = GROUPS * GROUP_SIZE
    lengths = PROMPT + torch.randint(3, 10, (rows,), generator=g)
    width = int(lengths.max())
    ids = torch.randint(10, 5000, (rows, width), generator=g)
    for group in range(GROUPS):
        first = group * GROUP_SIZE
        ids[first : first + GROUP_SIZE, :PROMPT] = ids[first, :PROMPT]
    attention = (torch.arange(width) < lengths.unsqueeze(1)).long()
    loss_mask = attention.float()
    loss_mask[:, :PROMPT] = 0
    scores = torch.randn(rows, generator=g)
    ends = (lengths - 1).unsqueeze(1)
    token_rewards = torch.zeros(rows, width).scatter_(1, ends, scores.unsqueeze(1))
    # Rollout log-probs off the training model's (as from bf16 rollouts): a real mismatch.
    rollout = -2.0 + 0.3 * torch.randn(rows, width, generator=g)
    return TrainBatch(
        input_ids=ids * attention,
        attention_mask=attention,
        loss_mask=loss_mask,
        rollout_logprobs=rollout * loss_mask,
        token_rewards=token_rewards,
        turn_rewards=scores.unsqueeze(1),
        turn_ends=ends,
        scores=scores,
        group_ids=torch.arange(rows) // GROUP_SIZE,
    )


def config(mini: int, micro: int, epochs: int = 1, **extra: str):
    overrides = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.kl_coef": "0.0",
        "algorithm.recompute_old_logprobs": "true",
        "algorithm.tis_cap": "2.0",
        "rollout.num_groups": str(GROUPS),
        "rollout.group_size": str(GROUP_SIZE),
        "rollout.temperature": "0.9",
        "optim.actor_lr": "1e-3",
        "optim.mini_batch_size": str(mini),
        "optim.micro_batch_size": str(micro),
        "optim.ppo_epochs": str(epochs),
        "trainer.total_steps": "1",
        **extra,
    }
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()])


def run_update(cfg, shortcut: bool):
    """One prepare + ppo_update on a fresh tiny model: (metrics, old log-probs, weights).
    Without the shortcut, every old log-prob is recomputed before the update, as the
    trainer did before (`recomputed_logprobs` over the whole batch)."""
    model, tokenizer = tiny_random_model(seed=3)
    models = build_models(cfg, model, tokenizer)
    optimizers = build_optimizers(cfg, models.actor, models.critic)
    batch = grouped_batch()
    prepare.prepare(batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=True)
    before = {}
    if not shortcut:
        assert batch.old_logprobs is None  # left to ppo_update
        batch.old_logprobs = prepare.recomputed_logprobs(batch, models, UpdateSettings.of(cfg))
        before = prepare.logprob_mismatch(
            batch.old_logprobs, batch.rollout_logprobs, batch.loss_mask
        )
    metrics = update.ppo_update(
        batch, models, optimizers, UpdateSettings.of(cfg), torch.Generator().manual_seed(7)
    )
    weights = {n: p.detach().clone() for n, p in models.actor.named_parameters()}
    return {**before, **metrics}, batch.old_logprobs, weights


def assert_same_results(got, want):
    (metrics, old, weights), (ref_metrics, ref_old, ref_weights) = got, want
    torch.testing.assert_close(old, ref_old, rtol=0, atol=2e-6)
    assert metrics.keys() == ref_metrics.keys()
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for name, weight in ref_weights.items():
        torch.testing.assert_close(weights[name], weight, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    ("mini", "micro", "epochs"),
    [(8, 4, 1), (8, 8, 1), (4, 2, 2), (2, 1, 3)],
    ids=["one-mini-batch", "one-micro-batch", "two-mini-batches-two-epochs", "single-rows"],
)
def test_old_logprobs_from_the_first_mini_batch_change_no_result(mini, micro, epochs):
    cfg = config(mini, micro, epochs)
    assert_same_results(run_update(cfg, shortcut=True), run_update(cfg, shortcut=False))


def test_one_mini_batch_needs_no_recompute_forward(monkeypatch):
    cfg = config(mini=8, micro=4)
    calls = []
    policy_logprobs = update.policy_logprobs

    def counted(model, batch, *args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return policy_logprobs(model, batch, *args, **kwargs)

    monkeypatch.setattr(update, "policy_logprobs", counted)
    monkeypatch.setattr(prepare, "policy_logprobs", counted)
    metrics, old, _ = run_update(cfg, shortcut=True)
    assert calls == [True, True]  # two training micro-batches, no no-grad forward
    assert bool((old != 0).any()) and metrics["rollout/logprob_diff_max"] > 0.1
    assert metrics["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_later_mini_batches_are_recomputed_up_front(monkeypatch):
    cfg = config(mini=4, micro=2)
    calls = []
    policy_logprobs = update.policy_logprobs

    def counted(model, batch, *args, **kwargs):
        calls.append((torch.is_grad_enabled(), len(batch)))
        return policy_logprobs(model, batch, *args, **kwargs)

    monkeypatch.setattr(update, "policy_logprobs", counted)
    monkeypatch.setattr(prepare, "policy_logprobs", counted)
    run_update(cfg, shortcut=True)
    recomputed = sum(rows for grad, rows in calls if not grad)
    assert recomputed == 4  # the 4 rows outside the first mini-batch, once


def first_mini_batch_gradients(micro: int):
    """Gradients, old log-probs and metrics of the whole batch as one mini-batch whose old
    log-probs are its own forward's (`prepare` left them None), in micro-batches of `micro`."""
    cfg = config(mini=8, micro=micro)
    model, tokenizer = tiny_random_model(seed=3)
    models = build_models(cfg, model, tokenizer)
    batch = grouped_batch()
    prepare.prepare(batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=True)
    metrics, finite = update.accumulate_gradients(batch, models, UpdateSettings.of(cfg))
    grads = {n: p.grad for n, p in models.actor.named_parameters() if p.grad is not None}
    return grads, batch.old_logprobs, metrics, finite


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_own_old_logprobs_do_not_depend_on_the_micro_batch_size(micro):
    grads, old, metrics, finite = first_mini_batch_gradients(micro)
    want_grads, want_old, want_metrics, _ = first_mini_batch_gradients(8)
    assert finite and grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        assert float((grads[name] - grad).norm() / grad.norm()) < 1e-5, name
    torch.testing.assert_close(old, want_old, rtol=0, atol=2e-6)
    for key, value in want_metrics.items():
        if key.startswith("perf/"):  # the work done: smaller micro-batches pad less
            continue
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_a_kl_penalty_in_the_reward_recomputes_before_the_update():
    cfg = config(8, 4, **{"algorithm.kl_coef": "0.1", "algorithm.kl_in_reward": "true"})
    model, tokenizer = tiny_random_model(seed=3)
    models = build_models(cfg, model, tokenizer)
    batch = grouped_batch()
    metrics = prepare.prepare(batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=True)
    assert batch.old_logprobs is not None and "rollout/logprob_diff_mean" in metrics


# ------------------------------------------------------------------ fused AdamW


def test_adamw_is_fused_on_cpu_and_steps_like_the_per_tensor_one():
    cfg = config(8, 4, **{"optim.weight_decay": "0.01"})
    results = []
    for fused in (True, False):
        model, tokenizer = tiny_random_model(seed=3)
        models = build_models(cfg, model, tokenizer)
        optimizers = build_optimizers(cfg, models.actor, None)
        assert optimizers.actor.param_groups[0]["fused"] is True
        if not fused:
            optimizers.actor.param_groups[0]["fused"] = None  # torch's default on a CPU
        g = torch.Generator().manual_seed(0)
        for _ in range(3):
            for param in models.actor.parameters():
                param.grad = torch.randn(param.shape, generator=g)
            optimizers.step()
        results.append([p.detach().clone() for p in models.actor.parameters()])
    for fused_weight, loop_weight in zip(*results, strict=True):
        torch.testing.assert_close(fused_weight, loop_weight, rtol=1e-6, atol=1e-7)


def test_loading_an_unfused_optimizer_state_keeps_the_fused_kernel():
    cfg = config(8, 4)
    model, tokenizer = tiny_random_model(seed=3)
    models = build_models(cfg, model, tokenizer)
    optimizers = build_optimizers(cfg, models.actor, None)
    for param in models.actor.parameters():
        param.grad = torch.ones_like(param)
    optimizers.step()
    state = optimizers.state_dict()
    for group in state["actor_optim"]["param_groups"]:  # as saved before fused AdamW
        group["fused"] = None
    optimizers.load_state_dict(state)
    assert optimizers.actor.param_groups[0]["fused"] is True
    optimizers.step()  # and it still steps


def test_fused_adamw_needs_one_supported_device_and_float_parameters():
    floats = [torch.nn.Parameter(torch.zeros(2))]
    assert fused_adamw_supported(floats)
    assert not fused_adamw_supported([])
    assert not fused_adamw_supported([torch.nn.Parameter(torch.zeros(2, device="meta"))])


def test_the_aggregated_advantage_shows_the_length_bias_of_token_mean():
    """GRPO gives every token of a trajectory its group-normalised score. Reduced per
    sequence (seq_mean_token_mean) they balance to 0 in each group; reduced per token
    (token_mean) they weigh long trajectories more, and equal the token mean."""
    model, _ = tiny_random_model(seed=3)
    got = {}
    for agg in ("token_mean", "seq_mean_token_mean"):
        cfg = config(mini=8, micro=4, **{"algorithm.loss_agg": agg})
        models = build_models(cfg, model, None)
        got[agg] = prepare.prepare(
            grouped_batch(), models, UpdateSettings.of(cfg), recompute_old_logprobs=True
        )
    token = got["token_mean"]
    assert token["actor/advantage_aggregated"] == pytest.approx(token["actor/advantage_mean"])
    assert abs(token["actor/advantage_aggregated"]) > 1e-3  # rows differ in length
    assert got["seq_mean_token_mean"]["actor/advantage_aggregated"] == pytest.approx(0, abs=1e-6)
