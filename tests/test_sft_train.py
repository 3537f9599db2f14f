"""SFT training: the agent-token NLL, its micro-batch invariance, and a short run that learns."""

from __future__ import annotations

import json

import pytest
import torch

from starpo.compute.batch import build_batch
from starpo.errors import UserError
from starpo.models import load_model, tiny_random_model
from starpo.rollout import EpisodeSettings
from starpo.sft.data import policy_records
from starpo.sft.options import TrainOptions
from starpo.sft.replay import replay_records
from starpo.sft.run import DATA_FILE, SUMMARY_FILE, run_sft
from starpo.sft.train import accumulate_gradients, evaluate, split_validation, turn_matches
from starpo.types import Trajectory

SETTINGS = EpisodeSettings(max_turns=10, max_actions_per_turn=3, think=False)


@pytest.fixture(scope="module")
def examples() -> list[Trajectory]:
    """Short Sokoban solver episodes of different lengths, 1-3 actions a turn."""
    from starpo.models import load_tokenizer

    records = [r for r in policy_records("sokoban", 12).records if len(r.steps) <= 4][:4]
    return replay_records(records, load_tokenizer(), SETTINGS, actions_per_turn=3).examples


def _grads(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def naive_loss(model, examples: list[Trajectory]) -> torch.Tensor:
    """Reference: each row's full logits and log-softmax; the agent tokens' NLL summed over
    the rows, over the number of agent tokens of all rows."""
    total = torch.zeros(())
    for t in examples:
        ids = torch.tensor([t.token_ids])
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        picked = logprobs.gather(-1, ids[0, 1:, None]).squeeze(-1)  # (T - 1,)
        total = total - (picked * torch.tensor(t.loss_mask[1:], dtype=torch.float)).sum()
    return total / sum(sum(t.loss_mask) for t in examples)


@pytest.mark.parametrize("plain_head", [True, False])
def test_loss_and_gradient_do_not_depend_on_the_micro_batch_size(examples, plain_head, monkeypatch):
    """Equal to a naive full-logits reference for every micro-batch size, through the
    hidden-state head (`head_logprobs`) and through the model's own logits alike."""
    if not plain_head:
        monkeypatch.setattr("starpo.sft.train.plain_head_weight", lambda model: None)
    model, tokenizer = tiny_random_model(seed=2)
    assert len({len(t.token_ids) for t in examples}) > 1  # padding is exercised
    reference = naive_loss(model, examples)
    reference.backward()
    reference = reference.detach()
    expected = _grads(model)
    for micro in (1, 2, len(examples)):
        totals = accumulate_gradients(model, examples, micro, tokenizer.pad_token_id)
        assert totals.tokens == sum(sum(t.loss_mask) for t in examples)
        assert totals.loss == pytest.approx(reference.item(), rel=1e-5)
        for got, want in zip(_grads(model), expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_sft_counts_the_flops_of_its_passes(examples):
    """The trainer's rule (`trainer.flops`) per micro-batch, the LM head on agent tokens
    only, forward and backward; the same total whatever the micro-batch size when no
    micro-batch shares a prompt (each row then runs on its own)."""
    from starpo.compute import flops

    model, tokenizer = tiny_random_model(seed=2)
    totals = accumulate_gradients(model, examples, 1, tokenizer.pad_token_id)
    want = 0.0
    for t in examples:
        row = build_batch([t], tokenizer.pad_token_id, per_turn_rewards=False)
        want += flops.training_pass(model, row, head_rows=sum(t.loss_mask[1:])).flops
    assert totals.flops == pytest.approx(want) and want > 0


def test_bf16_autocast_computes_the_same_loss_with_fp32_master_weights(examples):
    """--dtype bf16: the forward runs in bf16 under autocast, the weights and their
    gradients stay fp32, and the loss and gradient match fp32 within bf16 rounding."""
    from starpo.models.precision import precision_for

    model, tokenizer = tiny_random_model(seed=2)
    fp32 = accumulate_gradients(model, examples, 2, tokenizer.pad_token_id)
    expected = _grads(model)
    bf16 = precision_for(torch.bfloat16, "cpu")
    mixed = accumulate_gradients(model, examples, 2, tokenizer.pad_token_id, bf16)
    got = _grads(model)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(g.dtype == torch.float32 for g in got)
    assert mixed.loss != fp32.loss  # it really computed in bf16 ...
    assert mixed.loss == pytest.approx(fp32.loss, rel=2e-2)  # ... within its rounding
    flat = torch.cat([g.flatten() for g in got])
    want = torch.cat([g.flatten() for g in expected])
    assert torch.nn.functional.cosine_similarity(flat, want, dim=0) > 0.99


def test_dtype_option_is_checked():
    with pytest.raises(UserError, match="--dtype must be one of auto, fp32, bf16"):
        TrainOptions(dtype="fp8")


def test_token_accuracy_counts_the_models_top_token(examples):
    model, tokenizer = tiny_random_model(seed=2)
    batch = build_batch(examples[:2], tokenizer.pad_token_id, per_turn_rewards=False)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    hits = (logits[:, :-1].argmax(-1) == batch.input_ids[:, 1:]) & batch.loss_mask[:, 1:].bool()
    totals = evaluate(model, examples[:2], 1, tokenizer.pad_token_id)
    assert totals.hits == int(hits.sum())


def test_turn_matches_counts_runs_of_agent_tokens_all_hit():
    # Row 0: turns at columns 1-2 and 4-5; row 1: one turn at 2-4 (column 0 never counts).
    mask = torch.tensor([[1, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0]])
    hits = torch.tensor([True, True, True, False, True, True, True])  # row-major, 7 tokens
    assert turn_matches(mask, hits) == (2, 3)  # row 0's second turn has a miss
    assert turn_matches(torch.zeros(2, 4, dtype=torch.long), torch.zeros(0, dtype=torch.bool)) == (
        0,
        0,
    )


def test_turn_accuracy_is_the_share_of_replies_predicted_exactly(examples):
    """Against a naive reference: each turn's reply, teacher-forced, is a hit when every
    one of its tokens is the model's top choice."""
    model, tokenizer = tiny_random_model(seed=2)
    exact = turns = 0
    for t in examples[:3]:
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            top = model(input_ids=ids).logits[0, :-1].argmax(-1)
        mask, right = t.loss_mask[1:], (top == ids[0, 1:]).tolist()
        runs: list[list[bool]] = []
        for i, agent in enumerate(mask):
            if agent and (i == 0 or not mask[i - 1]):
                runs.append([])
            if agent:
                runs[-1].append(right[i])
        exact += sum(all(run) for run in runs)
        turns += len(runs)
    totals = evaluate(model, examples[:3], 2, tokenizer.pad_token_id)
    assert turns == sum(len(t.turns) for t in examples[:3])  # one reply a turn
    assert (totals.turn_hits, totals.turns) == (exact, turns)


def test_validation_split_keeps_seeds_together(examples):
    doubled = examples + examples  # two samples per seed
    train, val = split_validation(doubled, 0.2, seed=0)
    assert sorted(train + val) == list(range(len(doubled)))
    assert val and not {doubled[i].seed for i in train} & {doubled[i].seed for i in val}
    assert split_validation(doubled, 0.0, seed=0)[1] == []


@pytest.mark.slow
def test_short_sft_run_lowers_agent_loss_and_writes_a_loadable_folder(tmp_path):
    out = tmp_path / "sft"
    tiny = tiny_random_model(seed=0)
    before = [p.detach().clone() for p in tiny[0].parameters()]
    options = TrainOptions(
        epochs=4, lr=3e-3, batch_size=4, micro_batch_size=2, val_fraction=0.25, warmup_ratio=0.0
    )
    summary = run_sft(
        tiny,
        settings=EpisodeSettings(max_turns=1, max_actions_per_turn=1, think=False),
        out=out,
        options=options,
        from_solver=16,
        env_id="bandit",
        quiet=True,
    )
    epochs = summary["epochs"]
    assert [row["epoch"] for row in epochs] == [0, 1, 2, 3, 4]
    for row in epochs[1:]:  # each epoch's speed against the fp32 matmul peak
        assert row["dtype"] == "float32" and row["gflops"] > 0 and row["matmul_peak_gflops"] > 0
        assert row["peak_share"] == pytest.approx(row["gflops"] / row["matmul_peak_gflops"])
    assert epochs[-1]["val_loss"] < epochs[0]["val_loss"] - 1.0  # nats per agent token
    assert epochs[-1]["train_loss"] < epochs[1]["train_loss"]
    assert any(not torch.equal(a, p) for a, p in zip(before, tiny[0].parameters(), strict=True))
    data = summary["data"]
    assert (data["records"], data["kept"], data["train_examples"], data["val_examples"]) == (
        16,
        16,
        12,
        4,
    )
    assert data["agent_tokens"] < data["tokens"]
    written = json.loads((out / SUMMARY_FILE).read_text())
    assert written["epochs"] == json.loads(json.dumps(epochs))
    lines = (out / DATA_FILE).read_text().splitlines()
    assert len(lines) == 16 and Trajectory.from_json(lines[0]).turns[0].format_ok
    model, tokenizer = load_model(out)
    for name, tensor in tiny[0].state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor)
    assert tokenizer.chat_template
