"""RAGEN-2's template-collapse probe: sampling (seeded, on its own random stream),
batched cross-scoring (equal to scoring each pair alone), constructed policies that copy or
ignore their prompt, and a training run that logs the metrics."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch
from run_metrics import comparable
from transformers import LlamaConfig, LlamaForCausalLM

from starpo.compute import forward
from starpo.compute.cross_scoring import cross_scores, reply_logprobs
from starpo.diagnostics.template_collapse import SAMPLES, mi_key, template_collapse_metrics
from starpo.runs.metrics import read_metrics
from starpo.timing import step_train_seconds
from starpo.trainer.loop import Trainer
from starpo.trainer.mi_probe import first_turn_sample, reply_spans, turn_pair, uniform_sample
from starpo.types import Trajectory, Turn

NAMES = ("mi", "mi_z", "retrieval_acc", "chance", "matched_logp", "marginal_logp")


def trajectory(seed: int, turns: int) -> Trajectory:
    """Turns of 3 prompt tokens (mask 0) and 2 reply tokens (mask 1), ids unique per
    trajectory: 100 * seed + position."""
    ids, mask, ends = [], [], []
    for _ in range(turns):
        for flag in (0, 0, 0, 1, 1):
            ids.append(100 * seed + len(ids))
            mask.append(flag)
        ends.append(len(ids) - 1)
    turn = Turn("s", "r", "", [], [], True, 0.0, 0.0)
    return Trajectory(
        "bandit", seed, seed, turns=[turn] * turns, token_ids=ids, loss_mask=mask,
        logprobs=[0.0] * len(ids), turn_ends=ends,
    )  # fmt: skip


def test_reply_spans_and_prompts_are_the_context_each_turn_saw():
    traj = trajectory(1, turns=3)
    assert reply_spans(traj) == [(3, 5), (8, 10), (13, 15)]
    (prompt, reply), *_ = uniform_sample([traj], 1, random.Random(0))
    start = prompt[-1] - 100 + 1
    assert reply == [100 + start, 100 + start + 1]
    assert prompt == list(range(100, 100 + start))  # everything before: earlier turns too


def test_a_turn_after_a_context_reset_is_scored_under_the_prompt_it_saw():
    traj = trajectory(2, turns=3)
    traj.context_resets = [10]  # turn 3's prompt was built afresh at token 10
    pairs = [turn_pair(traj, span) for span in reply_spans(traj)]
    assert pairs[2] == ([210, 211, 212], [213, 214])
    assert pairs[1] == (list(range(200, 208)), [208, 209])


def test_samples_are_seeded_uniform_and_leave_other_random_streams_alone():
    trajectories = [trajectory(seed, turns=1 + seed % 4) for seed in range(20)]
    torch_state, python_state = torch.get_rng_state(), random.getstate()
    first = first_turn_sample(trajectories, 8, random.Random(7))
    again = first_turn_sample(trajectories, 8, random.Random(7))
    assert first == again and len(first) == 8
    assert len({tuple(p) for p, _ in first}) == 8  # 8 different trajectories
    assert all(len(p) == 3 for p, _ in first)  # first turns: 3 prompt tokens each
    picked = uniform_sample(trajectories, 8, random.Random(7))
    assert picked == uniform_sample(trajectories, 8, random.Random(7))
    assert picked != uniform_sample(trajectories, 8, random.Random(8))
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == python_state
    # Fewer trajectories than asked for: every one, once.
    assert len(uniform_sample(trajectories[:3], 8, random.Random(0))) == 3
    # A turn that generated nothing is never picked.
    empty = trajectory(99, turns=1)
    empty.loss_mask = [0] * len(empty.loss_mask)
    assert first_turn_sample([empty], 8, random.Random(0)) == []


def random_model(seed: int = 3) -> LlamaForCausalLM:
    """A small random Llama (512-token vocabulary, tied head) built without a tokenizer,
    so the test does not pay for loading one."""
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


def random_pairs(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 512, (int(18 + 5 * i),), generator=g).tolist() for i in range(n)]
    replies = [torch.randint(1, 512, (int(2 + i % 3),), generator=g).tolist() for i in range(n)]
    return prompts, replies


@pytest.mark.parametrize("packing", ["auto", "always", "never"])
@pytest.mark.parametrize("max_rows", [4, 16])
def test_batched_cross_scores_equal_scoring_each_pair_alone(monkeypatch, packing, max_rows):
    monkeypatch.setattr(forward, "PACKING", packing)
    model, pad = random_model(), 0
    prompts, replies = random_pairs(4)
    scores = cross_scores(model, prompts, replies, 0.7, pad, max_rows=max_rows)
    alone = torch.tensor(
        [[float(reply_logprobs(model, [p], [r], 0.7, pad)[0]) for r in replies] for p in prompts],
        dtype=torch.float64,
    )
    assert scores.shape == (4, 4)
    torch.testing.assert_close(scores, alone, atol=1e-4, rtol=0)
    assert (scores < 0).all()


def test_repeated_prompts_and_replies_are_scored_once_with_equal_entries():
    model, pad = random_model(), 0
    prompts, replies = random_pairs(3)
    prompts, replies = prompts + [prompts[0]], replies + [replies[1]]  # a repeat of each
    scores = cross_scores(model, prompts, replies, 1.0, pad, max_rows=16)
    assert torch.equal(scores[3], scores[0]) and torch.equal(scores[:, 3], scores[:, 1])
    alone = float(reply_logprobs(model, [prompts[3]], [replies[3]], 1.0, pad)[0])
    assert float(scores[3, 3]) == pytest.approx(alone, abs=1e-4)
    # Replies 0 and 3 tie between prompt 0 and its copy: each counts at most 1/2.
    assert template_collapse_metrics(scores.numpy())["retrieval_acc"] <= (0.5 + 1 + 1 + 0.5) / 4


def bigram_model(vocab: int = 48, hidden: int = 32, strength: float = 2.0) -> LlamaForCausalLM:
    """A model whose next token depends only on the current one (attention and MLP write
    nothing): token t < hidden predicts t again, a policy that copies what it last saw."""
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        model.model.layers[0].self_attn.o_proj.weight.zero_()
        model.model.layers[0].mlp.down_proj.weight.zero_()
        for token in range(hidden):
            model.model.embed_tokens.weight[token, token] = 1.0
            model.lm_head.weight[token, token] = strength
    return model


def test_replies_that_copy_their_prompt_are_retrieved_and_ignoring_ones_are_at_chance():
    model, n = bigram_model(), 6
    g = torch.Generator().manual_seed(1)
    bodies = [torch.randint(0, 32, (20,), generator=g).tolist() for _ in range(n)]
    # Each prompt ends with its own token; the reply copies it.
    copying = template_collapse_metrics(
        cross_scores(
            model, [b + [i] for i, b in enumerate(bodies)], [[i, i] for i in range(n)], 1.0, 0, 64
        ).numpy()
    )
    assert copying["retrieval_acc"] == 1.0
    assert copying["mi"] > 0.9 * torch.log(torch.tensor(float(n)))
    # Every prompt ends with the same token: the model cannot see the rest of it.
    ignoring = template_collapse_metrics(
        cross_scores(model, [b + [31] for b in bodies], [[i, i] for i in range(n)], 1.0, 0, 64)
        .numpy()
    )  # fmt: skip
    assert ignoring["retrieval_acc"] == ignoring["chance"] == 1 / n
    assert ignoring["mi"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.slow  # two short training runs (~10 s)
def test_training_logs_the_probe_and_changes_nothing_else(
    tmp_path: Path, bigram_model, make_bandit_config
):
    """mi_every=1: both samples' metrics and the probe's cost on every step; the run
    otherwise logs exactly what it logs with the probe off, and ends with the same weights."""
    model, tokenizer = bigram_model()
    runs = {}
    for every in (0, 1):
        cfg = make_bandit_config("grpo", total_steps=2, **{"diagnostics.mi_every": str(every)})
        policy = copy.deepcopy(model)
        Trainer(cfg, tmp_path / str(every), quiet=True, model=policy, tokenizer=tokenizer).train()
        runs[every] = (read_metrics(tmp_path / str(every)), policy.state_dict())
    (off, off_weights), (on, on_weights) = runs[0], runs[1]
    for row in on[1:]:  # step 0 is the validation before training
        for sample in SAMPLES:
            assert {mi_key(sample, name) for name in NAMES} <= set(row)
            # The bigram policy never sees past the prompt's last token, which every
            # bandit prompt shares: a policy that ignores its prompt.
            assert row[mi_key(sample, "retrieval_acc")] == row[mi_key(sample, "chance")]
            assert row[mi_key(sample, "mi")] == pytest.approx(0.0, abs=1e-4)
        assert row["timing_s/mi_probe"] > 0
    assert not any(key.startswith("diagnostics/mi/") for row in off for key in row)
    without_probe = [{k: v for k, v in r.items() if "/mi/" not in k} for r in comparable(on)]
    assert without_probe == comparable(off)
    assert all(torch.equal(on_weights[k], off_weights[k]) for k in off_weights)


def test_the_probe_is_left_out_of_the_training_minutes():
    line = {"timing_s/step": 10.0, "timing_s/validation": 3.0, "timing_s/mi_probe": 2.0}
    assert step_train_seconds(line) == pytest.approx(5.0)
