"""A tiny policy that can learn the bandit in a few CPU steps, and a matching config.

The model is a hand-set bigram model on the real tokenizer: its transformer layer writes
nothing to the residual stream, so each next-token distribution depends only on the current
token. After the prompt's `<answer>` it says "Dragon" or "Phoenix" with equal odds, then
"</answer>"; RL has to learn to prefer Dragon.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from starpo.compute.batch import TrainBatch
from starpo.config import load_config
from starpo.models import load_tokenizer

# Each context token -> the tokens that follow it (the text pieces are tokenised below).
CHAIN = {
    ">": ["D", "Ph"],
    "D": ["ragon"],
    "ragon": ["</"],
    "Ph": ["oen"],
    "oen": ["ix"],
    "ix": ["</"],
    "</": ["answer"],
    "answer": [">"],
}


def bigram_bandit_model(seed: int = 0, strength: float = 2.5):
    tokenizer = load_tokenizer()
    vocab = tokenizer.get_vocab()
    ids = {piece: vocab[piece] for piece in {*CHAIN, *(p for v in CHAIN.values() for p in v)}}
    hidden = 64
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for layer in model.model.layers:  # the layer adds nothing: a pure bigram model
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for direction, (context, followers) in enumerate(CHAIN.items()):
            model.model.embed_tokens.weight[ids[context], direction] = 1.0
            for follower in followers:
                # RMSNorm scales a one-hot to sqrt(hidden): logit = strength * 8 = 20.
                model.lm_head.weight[ids[follower], direction] = strength
    # Only the output layer learns: Adam's sign-like first steps on the one-hot embeddings
    # would otherwise blur the bigram structure that makes the task learnable in 6 steps.
    model.requires_grad_(False)
    model.lm_head.weight.requires_grad_(True)
    return model, tokenizer


def bandit_config(adv_estimator: str, total_steps: int = 6, **extra: str):
    overrides = {
        "env.kwargs": "{high_risk_prob: 1.0}",  # Dragon always pays 1.0: a clean signal
        "rollout.num_groups": "4",
        "rollout.group_size": "4",
        "rollout.max_turns": "1",
        "rollout.max_actions_per_turn": "1",
        "rollout.max_actions_per_traj": "1",
        "rollout.max_new_tokens": "8",
        "rollout.think": "false",
        "algorithm.adv_estimator": adv_estimator,
        "algorithm.kl_coef": "0.0",
        "optim.actor_lr": "0.05",
        "optim.critic_lr": "0.01",
        "optim.weight_decay": "0.0",
        "optim.mini_batch_size": "16",
        "optim.micro_batch_size": "8",
        "trainer.total_steps": str(total_steps),
        "trainer.val_every": "3",
        "trainer.val_seeds": "32",
        "trainer.val_temperature": "1.0",
        "trainer.save_every": "2",
        "trainer.tensorboard": "false",
        "trainer.log_trajectories": "2",
        "trainer.val_batch_size": "32",
        **extra,
    }
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.fixture
def bigram_model():
    return bigram_bandit_model


@pytest.fixture
def make_bandit_config():
    return bandit_config


def shared_prompt_batch(
    prefix: int, tail: int, *, first_turn: int, last_agent: int, rows: int = 4
) -> TrainBatch:
    """Random rows sharing their first `prefix` tokens (none when 0), then `tail` tokens of
    their own; agent tokens: the last `first_turn` of the shared part (a first turn) and the
    last `last_agent` of each row. Row 1 is 3 tokens shorter (right padding)."""
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(10, 5000, (1, prefix), generator=g).repeat(rows, 1)
    ids = torch.cat([shared, torch.randint(10, 5000, (rows, tail), generator=g)], dim=1)
    attention = torch.ones_like(ids)
    attention[1, -3:] = 0  # a shorter, right-padded row
    loss_mask = torch.zeros(ids.shape)
    loss_mask[:, max(prefix - first_turn, 0) : prefix] = 1
    loss_mask[:, -last_agent:] = 1
    return TrainBatch.for_scoring(ids, attention, loss_mask * attention)


@pytest.fixture
def prompt_batch():
    return shared_prompt_batch
