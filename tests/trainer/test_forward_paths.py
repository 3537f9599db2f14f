"""The training forward's faster paths give the plain forward's log-probs, entropy and
gradients: log-probs from hidden states (`head_logprobs`), the tied embedding's gradient
added in place, rows sharing a prompt packed into one sequence or sharing a KV cache."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from starpo.compute import forward
from starpo.compute.batch import TrainBatch
from starpo.models import tiny_random_model

PATHS = {  # name -> module settings that force it
    "logits": {"plain_head_weight": lambda model: None},
    "cache": {"PACKING": "never"},
    "packed": {"PACKING": "always"},
}


def _run(monkeypatch, batch: TrainBatch, path: str, model_fn=None, autocast: bool = False):
    """Log-probs, entropy and every gradient of a fixed loss, through `path` ("plain": the
    logits path without prefix sharing, the reference)."""
    model, _ = model_fn() if model_fn else tiny_random_model(seed=1)
    with monkeypatch.context() as patch:
        if path == "plain":
            patch.setattr(forward, "plain_head_weight", lambda model: None)
            patch.setattr(forward, "MIN_SHARED_PREFIX", 10**9)
        for name, value in PATHS.get(path, {}).items():
            patch.setattr(forward, name, value)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logprobs, entropy = forward.policy_logprobs(model, batch, temperature=0.8)
        (0.7 * logprobs.sum() + 0.3 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def _assert_same(got, want, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(got[0], want[0], rtol=rtol, atol=atol, msg="logprobs")
    torch.testing.assert_close(got[1], want[1], rtol=rtol, atol=atol, msg="entropy")
    assert got[2].keys() == want[2].keys()
    for name, grad in want[2].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(got[2][name], grad, rtol=rtol, atol=atol * scale, msg=name)


@pytest.mark.parametrize("path", ["logits", "cache", "packed"])
@pytest.mark.parametrize("prefix", [40, 0], ids=["shared-prompt", "no-shared-prompt"])
def test_every_path_matches_the_plain_forward(monkeypatch, prompt_batch, path, prefix):
    # Agent tokens inside the shared prompt (a first turn) and after it; a padded row.
    batch = prompt_batch(prefix, 12, first_turn=5, last_agent=8)
    _assert_same(_run(monkeypatch, batch, path), _run(monkeypatch, batch, "plain"))


@pytest.mark.parametrize("path", ["cache", "packed"])
def test_an_untied_head_matches_the_plain_forward(monkeypatch, prompt_batch, bigram_model, path):
    model, _ = bigram_model()
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    model.requires_grad_(True)
    batch = prompt_batch(40, 12, first_turn=5, last_agent=8)
    got = _run(monkeypatch, batch, path, lambda: (model, None))
    model.zero_grad(set_to_none=True)
    want = _run(monkeypatch, batch, "plain", lambda: (model, None))
    _assert_same(got, want)


def test_bf16_autocast_stays_close_to_the_logits_path(monkeypatch, prompt_batch):
    batch = prompt_batch(40, 12, first_turn=5, last_agent=8)
    got = _run(monkeypatch, batch, "packed", autocast=True)
    want = _run(monkeypatch, batch, "plain", autocast=True)
    for name, grad in want[2].items():
        assert float((got[2][name] - grad).norm() / grad.norm()) < 0.03, name
    assert float((got[0] - want[0]).abs().max()) < 0.05


def test_a_hooked_lm_head_runs_as_a_module():
    model, _ = tiny_random_model(seed=1)
    assert forward.plain_head_weight(model) is model.lm_head.weight
    handle = model.lm_head.register_forward_hook(lambda *_: None)
    assert forward.plain_head_weight(model) is None
    handle.remove()
    config = model.config
    config.model_type, kept = "gemma2", config.model_type  # soft-capped logits
    assert forward.plain_head_weight(model) is None
    config.model_type = kept


def test_the_tied_gradient_sink_is_only_for_a_training_tied_embedding():
    model, _ = tiny_random_model(seed=1)
    weight = model.lm_head.weight
    assert forward._tied_grad_sink(model, weight) == []
    with torch.no_grad():
        assert forward._tied_grad_sink(model, weight) is None
    weight.requires_grad_(False)
    assert forward._tied_grad_sink(model, weight) is None


# ------------------------------------------------------------------ packed rows


def _tiny_batch() -> TrainBatch:
    """Three rows sharing 3 tokens, then 2, 1 and 3 tokens of their own (right padded)."""
    ids = torch.tensor([[5, 6, 7, 10, 11, 0], [5, 6, 7, 20, 0, 0], [5, 6, 7, 30, 31, 32]])
    attention = (ids > 0).long()
    return TrainBatch.for_scoring(ids, attention, attention.float())


def _all_rows(batch: TrainBatch, prefix: int) -> list[forward.PromptCluster]:
    return [forward.PromptCluster(torch.arange(len(batch)), prefix)]


def test_pack_rows_puts_the_prefix_once_then_each_rows_own_tokens():
    packed = forward.pack_rows(_tiny_batch(), _all_rows(_tiny_batch(), 3))
    assert packed.ids.tolist() == [[5, 6, 7, 10, 11, 20, 30, 31, 32]]
    assert packed.positions.tolist() == [[0, 1, 2, 3, 4, 3, 3, 4, 5]]
    assert packed.segments.tolist() == [[-1, -1, -1, 0, 0, 1, 2, 2, 2]]
    assert packed.starts.tolist() == [3, 5, 6]


def test_packed_mask_shows_each_token_the_prefix_and_its_own_row_before_it():
    packed = forward.pack_rows(_tiny_batch(), _all_rows(_tiny_batch(), 3))
    mask = forward.packed_attention_mask(packed, "sdpa", torch.float32)[0, 0]
    assert mask[4].tolist() == [1, 1, 1, 1, 1, 0, 0, 0, 0]  # row 0's second token
    assert mask[6].tolist() == [1, 1, 1, 0, 0, 0, 1, 0, 0]  # row 2's first token
    assert mask[1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0]  # inside the prefix: causal
    additive = forward.packed_attention_mask(packed, "eager", torch.float32)[0, 0]
    assert torch.equal(additive == 0, mask)


def test_packed_index_finds_each_rows_token_at_each_position():
    batch = _tiny_batch()
    packed = forward.pack_rows(batch, _all_rows(batch, 3))
    index = forward.packed_index(packed, batch, torch.tensor([2, 3, 4, 5]))
    # Row 1 ends at position 3: its padding positions read its last token (no loss there).
    assert index.tolist() == [[2, 3, 4, 4], [2, 5, 5, 5], [2, 6, 7, 8]]
    assert torch.equal(packed.ids[0, index[2]], batch.input_ids[2, 2:6])


def _two_prompt_batch() -> TrainBatch:
    """Rows 0, 2, 3 share prompt [5, 6, 7], row 1 has [8, 9]; agent tokens (loss mask 1)
    follow the prompt. Row 3 is identical to row 0 but for its last token."""
    ids = torch.tensor(
        [[5, 6, 7, 10, 11, 0], [8, 9, 20, 21, 22, 23], [5, 6, 7, 30, 0, 0], [5, 6, 7, 10, 12, 0]]
    )
    attention = (ids > 0).long()
    loss = attention.float()
    loss[:, :3] = 0
    loss[1, 2] = 1
    return TrainBatch.for_scoring(ids, attention, loss)


def test_prompt_clusters_group_rows_by_the_tokens_before_their_first_agent_token():
    clusters = forward.prompt_clusters(_two_prompt_batch())
    assert [c.rows.tolist() for c in clusters] == [[0, 2, 3], [1]]
    assert [c.prefix for c in clusters] == [3, 5]  # row 1 alone: all but its last token


def test_packed_clusters_are_padded_sequences_each_with_its_own_prompt_once():
    batch = _two_prompt_batch()
    packed = forward.pack_rows(batch, forward.prompt_clusters(batch))
    assert packed.ids.shape == (2, 8)
    assert packed.ids[0].tolist() == [5, 6, 7, 10, 11, 30, 10, 12]
    assert packed.segments.tolist() == [[-1, -1, -1, 0, 0, 2, 3, 3], [-1] * 5 + [1] + [-2] * 2]
    assert packed.positions[1].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]
    mask = forward.packed_attention_mask(packed, "sdpa", torch.float32)[:, 0]
    assert mask[0, 6].tolist() == [1, 1, 1, 0, 0, 0, 1, 0]  # row 3's first own token
    assert mask[1, 7].tolist() == [1, 1, 1, 1, 1, 0, 1, 1]  # padding: prefix and padding
    index = forward.packed_index(packed, batch, torch.tensor([2, 3, 4]))
    for row in range(4):  # every row reads its own tokens at those positions
        length = int(batch.attention_mask[row].sum())
        want = batch.input_ids[row, [min(p, length - 1) for p in (2, 3, 4)]]
        assert torch.equal(packed.ids.flatten()[index[row]], want)


def test_groups_sharing_a_prompt_pack_one_sequence_per_prompt(monkeypatch, prompt_batch):
    """Two prompts, three rows each, interleaved: the packed path (one sequence per prompt)
    gives the plain forward's log-probs, entropy and gradients."""
    first = prompt_batch(40, 12, first_turn=0, last_agent=12, rows=3)
    second = prompt_batch(40, 12, first_turn=0, last_agent=12, rows=3)
    second.input_ids[:, :40] = first.input_ids[:, :40].flip(1)  # another prompt
    order = [0, 3, 1, 4, 2, 5]
    batch = TrainBatch(
        **{
            f.name: torch.cat([getattr(first, f.name), getattr(second, f.name)])[order]
            for f in fields(TrainBatch)
            if getattr(first, f.name) is not None
        }
    )
    model, _ = tiny_random_model(seed=1)
    plan = forward.forward_plan(model, batch)
    assert plan.kind == "packed" and [c.rows.tolist() for c in plan.clusters] == [
        [0, 2, 4],
        [1, 3, 5],
    ]
    _assert_same(_run(monkeypatch, batch, "auto"), _run(monkeypatch, batch, "plain"))


def test_packing_pays_for_short_tails_not_for_long_ones(prompt_batch):
    """The two bench cases (bench/bench_update.py): the bandit's ~200-token prompt with ~8
    answer tokens packs (measured 5.3 s vs 6.9 s an update), 8 x 64 tokens after a
    ~110-token prompt keeps the shared cache (3.15 s vs 3.56 s)."""
    model, _ = tiny_random_model(seed=1)
    smollm = {"hidden_size": 576, "intermediate_size": 1536, "num_key_value_heads": 3}
    for key, value in {**smollm, "num_attention_heads": 9}.items():
        setattr(model.config, key, value)
    bandit = prompt_batch(197, 11, first_turn=0, last_agent=8, rows=8)
    long = prompt_batch(110, 64, first_turn=0, last_agent=64, rows=8)
    assert forward.packing_pays(model, bandit, forward.shared_prefix_length(bandit))
    assert not forward.packing_pays(model, long, forward.shared_prefix_length(long))
    model.config.sliding_window = 4096  # a custom mask would drop the window
    assert not forward.packing_pays(model, bandit, forward.shared_prefix_length(bandit))


def test_gathered_rows_have_the_same_gradient_in_every_run():
    """Found on the 135M bandit: identical runs drifted apart from their first update. The
    packed path gathered hidden states with repeated indices (every row reads the prompt's
    last token), and advanced indexing's backward summed the repeats with atomic adds that
    race on a multi-threaded CPU (here ~9 in 10 runs differed in their last bits)."""
    g = torch.Generator().manual_seed(0)
    states, grad = torch.randn(200, 576, generator=g), torch.randn(8, 40, 576, generator=g)
    index = torch.randint(0, 200, (8, 40), generator=g)
    index[:, :3] = 5  # repeats, as the shared prompt's last position in every row
    assert torch.equal(forward.gather_rows(states, index), states[index])
    rows = states.view(4, 50, 576)  # (B, T, H) at positions along dim 1
    positions = torch.tensor([3, 7, 7, 49])
    assert torch.equal(forward.gather_rows(rows, positions, dim=1), rows[:, positions])
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = []
        for _ in range(40):
            leaf = states.clone().requires_grad_()
            (forward.gather_rows(leaf, index) * grad).sum().backward()
            runs.append(leaf.grad)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(run, runs[0]) for run in runs[1:])
