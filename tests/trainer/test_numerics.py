"""Training numerics: fp32 master weights under bf16, micro-batch invariance, KL reaching
bi-level GAE, old log-prob recomputation and the rollout/training mismatch."""

from __future__ import annotations

import pytest
import torch

from starpo.algorithms import AGGREGATIONS
from starpo.compute.batch import TrainBatch
from starpo.compute.forward import policy_logprobs
from starpo.config import load_config
from starpo.models import tiny_random_model
from starpo.models.precision import Precision
from starpo.trainer import prepare, update
from starpo.trainer.optim import build_optimizers
from starpo.trainer.train_models import build_models
from starpo.trainer.update_settings import UpdateSettings


def tiny_config(**overrides: str):
    base = {
        "rollout.num_groups": "2",
        "rollout.group_size": "3",
        "optim.mini_batch_size": "6",
        "optim.micro_batch_size": "6",
        "algorithm.adv_estimator": "gae",
        "trainer.total_steps": "1",
    }
    return load_config(None, [f"{k}={v}" for k, v in {**base, **overrides}.items()])


def two_turn_batch(rows: int = 6, seed: int = 0) -> TrainBatch:
    """Rows of unequal length: a shared 10-token prompt per group (3 rows a group), two
    agent turns around an observation, then right padding of 0..5 tokens."""
    g = torch.Generator().manual_seed(seed)
    width = 40
    ids = torch.randint(10, 5000, (rows, width), generator=g)
    ids[:3, :10] = ids[0, :10]
    ids[3:, :10] = ids[3, :10]
    attention = torch.ones(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width)
    turn_ends = torch.full((rows, 2), -1, dtype=torch.long)
    for r in range(rows):
        first_end = 12 + 2 * r  # turn 1: tokens 10..first_end (3 to 13 tokens)
        length = width - r  # r padding tokens at the end
        attention[r, length:] = 0
        loss_mask[r, 10 : first_end + 1] = 1
        loss_mask[r, first_end + 4 : length] = 1  # turn 2 after a 3-token observation
        turn_ends[r] = torch.tensor([first_end, length - 1])
    turn_rewards = torch.randn(rows, 2, generator=g)
    token_rewards = torch.zeros(rows, width)
    token_rewards[torch.arange(rows), turn_ends[:, 1]] = turn_rewards.sum(dim=1)
    return TrainBatch(
        input_ids=ids * attention,
        attention_mask=attention,
        loss_mask=loss_mask,
        rollout_logprobs=torch.zeros(rows, width),
        token_rewards=token_rewards,
        turn_rewards=turn_rewards,
        turn_ends=turn_ends,
        scores=turn_rewards.sum(dim=1),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1][:rows]),
    )


def prepared(cfg, models, batch: TrainBatch) -> TrainBatch:
    """Old log-probs from the model itself (ratio 1 at the start), then advantages."""
    with torch.no_grad():
        batch.rollout_logprobs = policy_logprobs(models.actor, batch, 1.0, False)[0]
    prepare.prepare(batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=False)
    return batch


# ------------------------------------------------------------- mixed precision


def test_bf16_keeps_fp32_master_weights_and_a_tiny_lr_moves_them():
    cfg = tiny_config(
        **{"model.dtype": "bf16", "optim.actor_lr": "1e-6", "algorithm.kl_coef": "0.01"}
    )
    model, tokenizer = tiny_random_model(seed=3)
    model.to(torch.bfloat16)  # what load_model(dtype=bf16) hands over
    precision = Precision(torch.bfloat16, "cpu")
    models = build_models(cfg, model, tokenizer, precision)
    assert all(p.dtype == torch.float32 for p in models.actor.parameters())
    assert all(p.dtype == torch.float32 for p in models.critic.parameters())
    assert all(p.dtype == torch.bfloat16 for p in models.reference.parameters())
    optimizers = build_optimizers(cfg, models.actor, models.critic)

    batch = prepared(cfg, models, two_turn_batch())
    seen = []  # dtypes of a projection's output during the update: the compute dtype
    hook = models.actor.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda _m, _i, out: seen.append(out.dtype)
    )
    before = {n: p.detach().clone() for n, p in models.actor.named_parameters()}
    metrics, finite = update.accumulate_gradients(batch, models, UpdateSettings.of(cfg))
    touched = {n: p.grad != 0 for n, p in models.actor.named_parameters()}
    optimizers.step()
    hook.remove()
    assert finite and seen and set(seen) == {torch.bfloat16}
    changed = total = 0
    for name, param in models.actor.named_parameters():
        moved = param.detach() != before[name]
        changed += int((moved & touched[name]).sum())
        total += int(touched[name].sum())
    # bf16 weights would keep ~98% of values: a 1e-6 step is below their resolution.
    assert changed / total > 0.9, changed / total
    state = optimizers.actor.state[next(iter(models.actor.parameters()))]
    assert state["exp_avg"].dtype == torch.float32


def test_fp16_is_refused_for_training():
    with pytest.raises(Exception, match="model.dtype must be one of"):
        tiny_config(**{"model.dtype": "fp16"})


def test_rollout_backend_computes_in_the_compute_dtype(tmp_path, bigram_model, make_bandit_config):
    from starpo.trainer.loop import Trainer

    cfg = make_bandit_config("grpo", total_steps=1, **{"model.dtype": "bf16"})
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    assert trainer.backend.compute_dtype == torch.bfloat16
    assert trainer.recompute_old_logprobs  # auto: bf16 rollouts differ from the update
    seen = []
    trainer.models.actor.lm_head.register_forward_hook(lambda _m, _i, o: seen.append(o.dtype))
    metrics = trainer.train_step(1)
    assert torch.bfloat16 in seen and trainer.models.actor.lm_head.weight.dtype == torch.float32
    assert metrics["rollout/logprob_diff_max"] >= 0.0 and "rollout/logprob_diff_mean" in metrics


# ------------------------------------------------------- micro-batch invariance


def _gradients(cfg, micro: int) -> dict[str, torch.Tensor]:
    cfg.optim.micro_batch_size = micro
    model, tokenizer = tiny_random_model(seed=5)
    models = build_models(cfg, model, tokenizer)
    batch = prepared(cfg, models, two_turn_batch())
    with torch.no_grad():  # a non-trivial ratio: the loss's clipping branches take part
        batch.old_logprobs = (
            batch.old_logprobs
            + 0.3
            * torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1))
            * batch.loss_mask
        )
    update.accumulate_gradients(batch, models, UpdateSettings.of(cfg))
    grads = {f"actor.{n}": p.grad for n, p in models.actor.named_parameters()}
    grads.update({f"critic.{n}": p.grad for n, p in models.critic.named_parameters()})
    return grads


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_gradients_do_not_depend_on_the_micro_batch_size(agg):
    cfg = tiny_config(**{"algorithm.loss_agg": agg, "algorithm.kl_coef": "0.05"})
    whole = _gradients(cfg, 6)
    for micro in (1, 4):  # 4 does not divide 6: uneven micro-batches too
        split = _gradients(cfg, micro)
        for name, grad in whole.items():
            if grad is None or not grad.abs().sum():
                continue
            rel = float((split[name] - grad).norm() / grad.norm())
            assert rel < 1e-5, (agg, micro, name, rel)


# ------------------------------------------------------- KL in bi-level GAE


def test_kl_in_the_reward_reaches_bi_level_advantages():
    advantages = []
    for coef in ("0.0001", "0.5"):
        cfg = tiny_config(
            **{
                "algorithm.adv_estimator": "bi_level_gae",
                "algorithm.kl_in_reward": "true",
                "algorithm.kl_coef": coef,
                "algorithm.whiten_advantages": "false",
            }
        )
        model, tokenizer = tiny_random_model(seed=2)
        models = build_models(cfg, model, tokenizer)
        with torch.no_grad():  # the policy drifts from the reference: KL > 0
            for p in models.actor.parameters():
                p.add_(0.05 * torch.randn_like(p))
        batch = prepared(cfg, models, two_turn_batch())
        advantages.append(batch.advantages)
    diff = (advantages[1] - advantages[0]).abs().max()
    assert diff > 1e-3, diff


# -------------------------------------------------- old log-probs and mismatch


def test_recomputed_old_logprobs_match_fp32_rollouts_and_are_logged(
    tmp_path, bigram_model, make_bandit_config
):
    from starpo.trainer.loop import Trainer

    cfg = make_bandit_config(
        "grpo",
        total_steps=1,
        **{"algorithm.recompute_old_logprobs": "true", "algorithm.tis_cap": "2.0"},
    )
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    metrics = trainer.train_step(1)
    assert metrics["rollout/logprob_diff_max"] < 1e-4  # fp32 decoding = training forward
    assert metrics["actor/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)


def test_mismatch_is_measured_without_recomputing(tmp_path, bigram_model, make_bandit_config):
    from starpo.trainer.loop import Trainer

    cfg = make_bandit_config("grpo", total_steps=1)
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    assert not trainer.recompute_old_logprobs  # auto in fp32: the rollout's are exact
    metrics = trainer.train_step(1)
    assert 0.0 <= metrics["rollout/logprob_diff_max"] < 1e-4


def test_tis_needs_recomputed_logprobs():
    with pytest.raises(Exception, match="recompute_old_logprobs"):
        tiny_config(**{"algorithm.tis_cap": "2.0", "algorithm.recompute_old_logprobs": "false"})


def test_greedy_training_rollouts_are_refused():
    with pytest.raises(Exception, match=r"rollout.temperature must be > 0.0, got 0(\.0)? .greedy"):
        tiny_config(**{"rollout.temperature": "0"})
    assert tiny_config(**{"trainer.val_temperature": "0"}).trainer.val_temperature == 0.0


def test_bf16_lean_rollouts_train_with_recomputed_old_logprobs(
    tmp_path, bigram_model, make_bandit_config
):
    """fp32 training, bf16 rollouts (rollout.dtype=bf16, the default on CPUs with native
    bf16): old log-probs are recomputed, the gap is logged, and the rollout copy follows
    every update."""
    from starpo.rollout.backends.lean import LeanBackend
    from starpo.trainer.loop import Trainer

    cfg = make_bandit_config("grpo", total_steps=2, **{"rollout.dtype": "bf16"})
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    assert isinstance(trainer.backend, LeanBackend)
    assert trainer.backend.numerics.compute_dtype == "bfloat16"
    assert trainer.recompute_old_logprobs  # auto: bf16 rollouts are not exact
    head = trainer.backend.lean.lm_head
    before = head.clone()
    metrics = trainer.train_step(1)
    assert 0.0 < metrics["rollout/logprob_diff_max"] < 0.5
    assert head.dtype == torch.bfloat16 and not torch.equal(head, before)  # synced
    torch.testing.assert_close(head.float(), model.lm_head.weight.detach(), atol=1e-2, rtol=1e-2)
