"""Every algorithm option runs end to end on the tiny bandit model (2 steps each)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from starpo.compute.activation_checkpointing import decoder_layers
from starpo.trainer.loop import Trainer

pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs

VARIANTS = {
    "vanilla-starpo-kl-loss-k3": {"algorithm.kl_coef": "0.001", "algorithm.clip_high": "0.2"},
    "kl-loss-k1-explicit": {"algorithm.kl_coef": "0.001", "algorithm.kl_estimator": "k1"},
    "recompute-old-logprobs-tis-cosine": {
        "algorithm.recompute_old_logprobs": "true",
        "algorithm.tis_cap": "2.0",
        "optim.lr_schedule": "cosine",
        "optim.lr_warmup_steps": "1",
    },
    "bf16-autocast-with-critic-and-kl": {"model.dtype": "bf16", "algorithm.kl_coef": "0.01"},
    "kl-k3-in-reward": {
        "algorithm.kl_coef": "0.01",
        "algorithm.kl_estimator": "k3",
        "algorithm.kl_in_reward": "true",
    },
    "bi-level-gae-per-turn": {
        "algorithm.adv_estimator": "bi_level_gae",
        "algorithm.reward_placement": "per_turn",
    },
    "gigpo-mean-only": {"algorithm.adv_estimator": "gigpo", "algorithm.norm_by_std": "false"},
    "dual-clip-seq-mean-2-epochs": {
        "algorithm.dual_clip": "3.0",
        "algorithm.loss_agg": "seq_mean_token_mean",
        "optim.ppo_epochs": "2",
        "optim.mini_batch_size": "8",
    },
    "filter-bottom-std": {
        "filter.enabled": "true",
        "filter.ratio": "0.5",
        "filter.mode": "bottom_std",
        "optim.mini_batch_size": "8",
    },
    "filter-top-k": {
        "filter.enabled": "true",
        "filter.rule": "top_k",
        "filter.top_k": "2",
        "optim.mini_batch_size": "8",
    },
    "filter-top-p-softmax-variance": {
        "filter.enabled": "true",
        "filter.rule": "top_p",
        "filter.top_p": "0.6",
        "filter.top_p_shares": "softmax",
        "filter.metric": "variance",
    },
    "filter-min-p-sqrt-loss-scale": {
        "filter.enabled": "true",
        "filter.rule": "min_p",
        "filter.min_p": "0.9",
        "filter.loss_scale": "sqrt",
    },
    "filter-top-p-without-zero-std-groups": {
        "filter.enabled": "true",
        "filter.rule": "top_p",
        "filter.keep_zero_std": "false",
    },
    "soft-reweight-dr-grpo": {  # RAGEN-2's soft advantage reweighting, GRPO without std
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_by_std": "false",
        "algorithm.loss_agg": "seq_mean_token_sum",
        "filter.soft_reweight": "true",
    },
    "lora-with-kl": {
        "model.lora.enabled": "true",
        "model.lora.rank": "4",
        "model.lora.alpha": "8",
        "algorithm.kl_coef": "0.01",
    },
    "lora-gradient-checkpointing": {  # adapters inside the recomputed layers; a critic too
        "model.gradient_checkpointing": "true",
        "model.lora.enabled": "true",
        "model.lora.rank": "4",
        "model.lora.alpha": "8",
    },
}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_trains(tmp_path: Path, name: str, bigram_model, make_bandit_config):
    overrides = {
        "trainer.val_every": "0",
        "trainer.val_before_train": "false",
        "trainer.val_seeds": "4",
        **VARIANTS[name],
    }
    cfg = make_bandit_config("gae", total_steps=2, **overrides)
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    before = {
        n: p.detach().clone() for n, p in trainer.models.actor.named_parameters() if p.requires_grad
    }
    history = trainer.train()
    last = history[-1]
    assert all(math.isfinite(v) for k, v in last.items() if isinstance(v, float)), last
    after = dict(trainer.models.actor.named_parameters())
    assert any(not torch.equal(after[n], p) for n, p in before.items())
    if "kl" in name and "in-reward" not in name:
        assert "actor/kl_loss" in last
    if "in-reward" in name:
        assert "actor/reward_kl" in last
    if name.startswith("lora"):
        assert all("lora" in n for n in before)  # only adapters train
        assert (tmp_path / "final" / "config.json").is_file()  # merged export
    if "checkpointing" in name:  # the trainer did switch it on, for actor and critic
        for module in (trainer.models.actor, trainer.models.critic):
            layers = decoder_layers(module)
            assert layers and all("forward" in vars(layer) for layer in layers)
    if name in ("filter-bottom-std", "filter-top-k"):
        assert last["rollout/kept_trajectories"] == 8
    if name.startswith("filter"):  # the groups kept, 4 trajectories each
        assert all(0 <= h["rollout/kept_groups"] <= 4 for h in history)
        assert all(h["rollout/kept_trajectories"] == 4 * h["rollout/kept_groups"] for h in history)
    if "loss-scale" in name:  # sqrt of the kept share
        assert last["filter/loss_scale"] == pytest.approx(
            math.sqrt(last["rollout/kept_groups"] / 4)
        )
    if "soft-reweight" in name:  # the most uncertain group keeps its advantages
        assert all(h["filter/weight_max"] == 1.0 for h in history)
        assert all(0.0 <= h["filter/weight_min"] <= h["filter/weight_mean"] <= 1.0 for h in history)


def test_a_step_whose_groups_all_earn_one_reward_trains_on_nothing_without_zero_std_groups(
    tmp_path: Path, bigram_model, make_bandit_config
):
    """filter.keep_zero_std=false and both arms paying 1.0: no group's rewards vary, so
    no group is kept, and the step makes no update (RAGEN-2's empty step after filtering)."""
    cfg = make_bandit_config(
        "grpo",
        total_steps=2,
        **{
            "env.kwargs": "{low_risk_reward: 1.0, high_risk_reward: 1.0, high_risk_prob: 1.0}",
            "filter.enabled": "true",
            "filter.rule": "top_p",
            "filter.keep_zero_std": "false",
            "trainer.val_every": "0",
            "trainer.val_before_train": "false",
            "trainer.val_seeds": "4",
        },
    )
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    before = {n: p.detach().clone() for n, p in trainer.models.actor.named_parameters()}
    history = trainer.train()
    assert [h["rollout/kept_groups"] for h in history] == [0, 0]
    assert all(h["rollout/zero_std_groups"] == 1.0 for h in history)
    # The signal metrics say the same: no group informative (success, which arm was
    # picked, may still vary: it is not the reward here).
    assert all(h["signal/informative_groups"] == 0.0 for h in history)
    assert not any(k.startswith("actor/") for h in history for k in h)  # no update ran
    after = dict(trainer.models.actor.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in before.items())
