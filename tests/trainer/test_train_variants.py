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
    if "filter" in name:
        assert last["rollout/kept_trajectories"] == 8
