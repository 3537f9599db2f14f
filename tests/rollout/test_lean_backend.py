"""The lean decoder must change speed only: same tokens and log-probs as the transformers
forward in fp32, close ones in bf16, and fresh weights after every update."""

from __future__ import annotations

import copy

import pytest
import torch

from starpo.models.precision import rollout_dtype
from starpo.registry import GENERATION_BACKENDS
from starpo.rollout import EpisodeSettings, RolloutEngine
from starpo.rollout.backends import hf as hf_backend
from starpo.rollout.backends import lean_decoder
from starpo.rollout.backends.base import GenerationRequest, SamplingParams
from starpo.rollout.backends.hf import (
    HFBackend,
    block_sums_fp64,
    common_prefix_length,
    inverse_cdf_sample,
)
from starpo.rollout.backends.lean import LeanBackend
from starpo.rollout.backends.lean_decoder import lean_support
from starpo.rollout.backends.lean_kv_store import KVStore
from starpo.rollout.backends.linear_kernels import onednn_applies, pick_linear

PROMPTS = [[1, 5, 7, 9, 11] * 4, [1, 5, 7, 9, 11] * 4, [2, 3, 4], [2, 3, 4, 8, 8, 8, 8]]


def _two_calls(backend, temperature: float):
    """A shared prompt, uneven prompt lengths, a released session and a second turn."""
    params = SamplingParams(max_new_tokens=10, temperature=temperature)
    first = backend.generate([GenerationRequest(i, list(p)) for i, p in enumerate(PROMPTS)], params)
    backend.release([1])
    second = backend.generate(
        [GenerationRequest(i, [20, 21, 22][: i + 1]) for i in (0, 2, 3)], params
    )
    return first + second


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lean_fp32_matches_transformers_forward(tiny, temperature):
    model, tokenizer = tiny
    hf = _two_calls(HFBackend(model, pad_token_id=tokenizer.pad_token_id, seed=3), temperature)
    lean = _two_calls(LeanBackend(model, pad_token_id=tokenizer.pad_token_id, seed=3), temperature)
    assert [g.token_ids for g in lean] == [g.token_ids for g in hf]
    for a, b in zip(lean, hf, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def _episodes(tiny, backend_name: str, dtype=torch.float32, seed: int = 0):
    model, tokenizer = tiny
    backend = GENERATION_BACKENDS[backend_name](model, tokenizer, compute_dtype=dtype, seed=seed)
    settings = EpisodeSettings(max_turns=3, max_new_tokens=12, temperature=0.0)
    return RolloutEngine(backend, tokenizer, settings).run("sokoban", [10000, 10001], 2)


def test_multi_turn_episodes_are_identical_on_both_backends(tiny):
    lean, hf = _episodes(tiny, "lean"), _episodes(tiny, "hf")
    assert all(len(t.turns) == 3 for t in lean)
    assert [t.token_ids for t in lean] == [t.token_ids for t in hf]
    for a, b in zip(lean, hf, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_bf16_weights_give_close_logprobs_and_say_they_are_inexact(tiny):
    model, tokenizer = tiny
    backend = LeanBackend(model, pad_token_id=tokenizer.pad_token_id, weights_dtype=torch.bfloat16)
    assert backend.numerics.exact_logprobs is False
    assert backend.numerics.compute_dtype == "bfloat16"
    assert LeanBackend(model, pad_token_id=0).numerics.exact_logprobs is True
    prompt = [GenerationRequest(0, PROMPTS[0])]
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    (low,) = backend.generate(prompt, params)
    (exact,) = HFBackend(model, pad_token_id=tokenizer.pad_token_id).generate(prompt, params)
    # Score bf16's tokens with the fp32 model: close, not equal.
    ids = torch.tensor([PROMPTS[0] + low.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(PROMPTS[0]) - 1 : -1]
    fp32 = torch.log_softmax(logits, -1).gather(-1, ids[0, len(PROMPTS[0]) :, None])[:, 0]
    gap = (torch.tensor(low.logprobs) - fp32).abs()
    assert 0 < gap.max() < 0.05
    assert exact.token_ids[:2] == low.token_ids[:2]


def test_update_weights_refreshes_the_copies(tiny):
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    request = [GenerationRequest(0, PROMPTS[2])]
    for dtype in (torch.float32, torch.bfloat16):
        backend = LeanBackend(model, pad_token_id=0, weights_dtype=dtype)
        before = backend.generate(request, params)[0].logprobs
        with torch.no_grad():  # an "optimizer step" on a fused (q) and an aliased (o) weight
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(3.0)
                layer.self_attn.o_proj.weight.mul_(-1.0)
        backend.reset()
        stale = backend.generate(request, params)[0].logprobs
        backend.update_weights(model, version=1)
        backend.reset()
        synced = backend.generate(request, params)[0].logprobs
        backend.reset()
        fresh = LeanBackend(model, pad_token_id=0, weights_dtype=dtype)
        assert synced == fresh.generate(request, params)[0].logprobs
        assert synced != before
        if dtype == torch.bfloat16:
            assert stale == before  # copies are used until update_weights
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.div_(3.0)
                layer.self_attn.o_proj.weight.mul_(-1.0)


def test_kv_store_grows_and_selects_rows_without_losing_content():
    store = KVStore(layers=2, rows=2, kv_heads=1, head_dim=4, dtype=torch.float32, device="cpu")
    keys = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    store.ensure(3)
    for layer in range(2):
        store.write(layer, keys, -keys)
    store.length += 3
    assert store.capacity == 8
    store.ensure(100)  # grows: the first 3 columns survive
    assert store.capacity >= 100
    torch.testing.assert_close(store.keys[1][:, :, :3], keys)
    store.batch_select_indices(torch.tensor([1, 1, 0]))
    assert store.rows == 3
    torch.testing.assert_close(store.values[0][:, :, :3], -keys[[1, 1, 0]])


def test_kv_store_shares_prompt_blocks_between_rows_without_copying_them():
    store = KVStore(layers=1, rows=2, kv_heads=1, head_dim=4, dtype=torch.float32, device="cpu")
    prompts = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    store.ensure(5)
    store.write(0, prompts, -prompts)
    store.length += 3
    store.share(torch.tensor([1, 0, 1, 1]))  # four rows, three of them read prompt 1
    assert (store.rows, store.shared, store.capacity) == (4, 3, 8)
    (level,) = store.levels
    torch.testing.assert_close(level.keys[0], prompts)
    own = torch.full((4, 1, 1, 4), 7.0)
    keys, values = store.write(0, own, -own)  # the next column goes to the rows' buffers
    assert keys.shape == (4, 1, 1, 4)
    store.length += 1
    store.ensure(40)  # growth keeps the rows' own columns and the shared blocks
    torch.testing.assert_close(store.keys[0][:, :, :1], own)
    store.batch_select_indices(torch.tensor([3, 1]))
    assert level.rows.tolist() == [1, 0]
    assert [(block, rows.tolist()) for block, rows in level.groups()] == [(0, [1]), (1, [0])]


def test_sharing_again_adds_a_level_and_keeps_the_common_start_one_block():
    # A common start read by every row, then each row's prompt shared by its rollouts: a
    # tree of two levels, the common start held once, each prompt's tail once.
    store = KVStore(layers=1, rows=1, kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu")
    start = torch.arange(6, dtype=torch.float32).view(1, 1, 3, 2)
    store.ensure(10)
    store.write(0, start, -start)
    store.length += 3
    store.share(torch.zeros(2, dtype=torch.long))  # two prompts read the common start
    tails = torch.tensor([[[[10.0, 11.0]]], [[[20.0, 21.0]]]])
    store.write(0, tails, -tails)
    store.length += 1
    store.share(torch.tensor([1, 1, 0]))  # three rollouts: two of prompt 1, one of prompt 0
    assert (store.rows, store.shared, store.length) == (3, 4, 4)
    common, prompts = store.levels
    torch.testing.assert_close(common.keys[0], start)
    torch.testing.assert_close(prompts.keys[0], tails)
    torch.testing.assert_close(prompts.values[0], -tails)
    assert common.rows.tolist() == [0, 0, 0] and prompts.rows.tolist() == [1, 1, 0]
    assert store.capacity - store.length >= 6  # the room reserved for the turn survives
    assert [(b, r.tolist()) for b, r in prompts.groups()] == [(0, [2]), (1, [0, 1])]
    # Each row's whole history, in column order, as the fused kernel reads it.
    whole = torch.cat([start.expand(2, -1, -1, -1), tails], dim=2)[[1, 1, 0]]
    keys, values = store.shared_columns(0)
    torch.testing.assert_close(keys, whole)
    torch.testing.assert_close(values, -whole)
    blocks = 2 * 4 * (3 * 2 + 2 * 2)  # keys and values, fp32: the start's, the tails'
    room = 2 * 4 * 3 * (store.capacity - store.shared) * 2  # 3 rows' own buffers
    assert store.held_bytes() == blocks + room and store.capacity - store.shared == 12
    # A selection remaps every level: the rows' own columns are copied, no block is.
    store.batch_select_indices(torch.tensor([2, 0]))
    assert common.rows.tolist() == [0, 0] and prompts.rows.tolist() == [0, 1]


def test_lean_support_names_what_is_missing(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    model, tokenizer = tiny
    assert lean_support(model) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer)))
    assert "gpt2" in lean_support(gpt2)
    with pytest.raises(ValueError, match="rollout.backend=hf"):
        LeanBackend(gpt2, pad_token_id=0)
    auto = GENERATION_BACKENDS["auto"]
    assert type(auto(gpt2, tokenizer)) is HFBackend  # falls back instead of failing
    assert type(auto(model, tokenizer)) is LeanBackend


def test_inverse_cdf_sampling_follows_the_distribution():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).expand(40000, -1)
    draws = inverse_cdf_sample(probs, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(draws, minlength=4).float() / len(draws)
    torch.testing.assert_close(frequencies, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.01, rtol=0)
    assert (draws != 3).all()  # zero probability: never drawn
    # Tokens at block edges and past the last full block (vocab 1000, blocks of 256).
    edges = torch.zeros(4, 1000)
    for row, token in enumerate((0, 255, 256, 999)):
        edges[row, token] = 1.0
    generator = torch.Generator().manual_seed(1)
    assert inverse_cdf_sample(edges, generator).tolist() == [0, 255, 256, 999]


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 128])
def test_block_sums_a_few_rows_at_a_time_are_bitwise_the_whole_sum(rows):
    blocks = torch.rand(rows, 192, 256, generator=torch.Generator().manual_seed(rows))
    whole = blocks.sum(dim=-1, dtype=torch.float64)
    assert torch.equal(block_sums_fp64(blocks), whole)
    assert torch.equal(block_sums_fp64(blocks, rows_at_once=1), whole)


def test_rollout_dtype_auto_follows_compute_dtype_and_the_cpu(monkeypatch):
    import starpo.models.precision as precision

    cpu = torch.device("cpu")
    assert rollout_dtype("fp32", torch.bfloat16, cpu) == torch.float32
    assert rollout_dtype("bf16", torch.float32, cpu) == torch.bfloat16
    assert rollout_dtype("auto", torch.bfloat16, torch.device("cuda")) == torch.bfloat16
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        assert rollout_dtype("auto", torch.float32, cpu) == expected
    assert rollout_dtype("auto", torch.float32, torch.device("cuda")) == torch.float32


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_matmul_kernels_give_the_same_tokens_and_logprobs(tiny, temperature):
    """oneDNN's fp32 kernel only reorders the sums: same tokens, log-probs within 1e-5."""
    if onednn_applies(torch.float32, torch.device("cpu")) is not None:
        pytest.skip("this PyTorch build has no oneDNN")
    model, tokenizer = tiny
    runs = {}
    for kernel in ("torch", "onednn"):
        backend = LeanBackend(
            model, pad_token_id=tokenizer.pad_token_id, seed=3, linear_kernel=kernel
        )
        assert backend.numerics.matmul_kernel == kernel
        runs[kernel] = _two_calls(backend, temperature)
    assert [g.token_ids for g in runs["onednn"]] == [g.token_ids for g in runs["torch"]]
    for a, b in zip(runs["onednn"], runs["torch"], strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_auto_matmul_kernel_is_onednn_for_fp32_on_a_cpu_only():
    cpu = torch.device("cpu")
    expected = "onednn" if torch.backends.mkldnn.is_available() else "torch"
    assert pick_linear("auto", torch.float32, cpu)[0] == expected
    assert pick_linear("auto", torch.bfloat16, cpu)[0] == "torch"
    assert pick_linear("auto", torch.float32, torch.device("meta"))[0] == "torch"
    assert pick_linear("torch", torch.float32, cpu)[0] == "torch"
    with pytest.raises(ValueError, match="fp32 weights, not torch.bfloat16; use 'auto'"):
        pick_linear("onednn", torch.bfloat16, cpu)
    with pytest.raises(ValueError, match="unknown linear kernel 'mkl'"):
        pick_linear("mkl", torch.float32, cpu)


COMMON = list(range(30, 60))  # a 30-token common start, as a system prompt is
SHARED_START = [COMMON + [5, 6], COMMON + [5, 6], COMMON + [7], COMMON + [8, 9, 10, 11]]
#: An evaluation's prompts: every case its own, all after one system prompt.
DISTINCT_START = [COMMON + [5, 6], COMMON + [4], COMMON + [7], COMMON + [8, 9, 10, 11]]


@pytest.mark.parametrize(
    "backend_class,copy_from",
    [(HFBackend, None), (LeanBackend, 16), (LeanBackend, 10**6)],
    ids=["hf", "lean", "lean-block-by-block"],
)
@pytest.mark.parametrize("prompts", [SHARED_START, DISTINCT_START], ids=["groups", "distinct"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_common_prompt_start_is_encoded_once_and_changes_nothing(
    tiny, backend_class, copy_from, prompts, temperature, monkeypatch
):
    # The second turn feeds 1-19 tokens a row: on the lean backend a feed that wide reads
    # the shared blocks copied into each row (FUSED_SHARED_WIDTH), or block by block.
    model, tokenizer = tiny
    params = SamplingParams(max_new_tokens=8, temperature=temperature)
    if copy_from is not None:
        monkeypatch.setattr(lean_decoder, "FUSED_SHARED_WIDTH", copy_from)

    def play(share: bool):
        monkeypatch.setattr(hf_backend, "MIN_COMMON_PREFIX", 16 if share else 10**6)
        backend = backend_class(model, pad_token_id=tokenizer.pad_token_id, seed=5)
        fed = []
        feed = backend._feed
        monkeypatch.setattr(backend, "_feed", lambda chunks: fed.append(chunks) or feed(chunks))
        requests = [GenerationRequest(i, list(p)) for i, p in enumerate(prompts)]
        first = backend.generate(requests, params)
        second = backend.generate(
            [GenerationRequest(i, list(range(20, 40))[: 1 + 6 * i]) for i in range(4)], params
        )
        return first + second, fed[0]

    shared, first_feed = play(share=True)
    separate, first_separate = play(share=False)
    assert first_feed == [COMMON]  # the common start once, for one row
    assert first_separate == list(map(list, dict.fromkeys(map(tuple, prompts))))
    assert [g.token_ids for g in shared] == [g.token_ids for g in separate]
    for a, b in zip(shared, separate, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_common_prefix_length_leaves_every_sequence_a_token():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4]]) == 2
    assert common_prefix_length([[1, 2], [1, 2, 3]]) == 1
    assert common_prefix_length([[4], [5]]) == 0


@pytest.mark.parametrize(
    "prompts,blocks,shared",
    [(DISTINCT_START, [1], len(COMMON)), (SHARED_START, [1, 3], None)],
    ids=["distinct", "groups"],
)
def test_the_lean_cache_holds_a_common_start_once(tiny, prompts, blocks, shared):
    # Distinct prompts (an evaluation) read one block holding the system prompt; prompts
    # that rollouts share get a block each for their tails, on top of the common start.
    model, tokenizer = tiny
    backend = LeanBackend(model, pad_token_id=tokenizer.pad_token_id, seed=5)
    requests = [GenerationRequest(i, list(p)) for i, p in enumerate(prompts)]
    backend.generate(requests, SamplingParams(max_new_tokens=3, temperature=1.0))
    store = backend._cache
    assert [level.keys[0].shape[0] for level in store.levels] == blocks
    assert store.levels[0].columns == len(COMMON)
    assert store.shared == (shared or max(map(len, prompts)))
    for level, count in zip(store.levels, blocks, strict=True):
        assert sorted(set(level.rows.tolist())) == list(range(count))
    backend = LeanBackend(model, pad_token_id=tokenizer.pad_token_id, seed=5)
    backend.share_common_start = False  # the copy per prompt, as before
    backend.generate(requests, SamplingParams(max_new_tokens=3, temperature=1.0))
    assert backend._cache.shared == (0 if blocks == [1] else max(map(len, prompts)))


def _count_feed_widths(lean) -> list[int]:
    """The width (tokens a row) of every forward `lean` runs from now on."""
    widths, forward = [], lean.forward

    def counted(ids, *rest):
        widths.append(ids.shape[1])
        return forward(ids, *rest)

    lean.forward = counted
    return widths


def test_the_attention_tally_counts_a_shared_block_once_per_decode_step(tiny):
    # An evaluation's 4 distinct prompts over one system prompt: with the common start in
    # one block, a decode step's attention reads that block once, not once per row; both
    # ways play the same greedy tokens, so the byte counts differ by exactly that.
    model, tokenizer = tiny
    requests = [GenerationRequest(i, list(p)) for i, p in enumerate(DISTINCT_START)]
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    tallies, tokens, decode_steps = {}, {}, {}
    for share in (True, False):
        backend = LeanBackend(model, pad_token_id=tokenizer.pad_token_id, seed=5)
        backend.share_common_start = share
        widths = _count_feed_widths(backend.lean)
        tokens[share] = [g.token_ids for g in backend.generate(requests, params)]
        tallies[share] = backend.lean.attention
        decode_steps[share] = widths.count(1)
    assert tokens[True] == tokens[False] and decode_steps[True] == decode_steps[False] > 0
    shared, copied = tallies[True], tallies[False]
    assert shared.decode_s > 0 and shared.feed_s > 0 and shared.feed_bytes > 0
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    one_block = 2 * 4 * config.num_key_value_heads * len(COMMON) * head_dim  # K and V, fp32
    saved = decode_steps[True] * config.num_hidden_layers * one_block * (len(requests) - 1)
    assert copied.decode_bytes - shared.decode_bytes == saved


def _full_attention(q, keys, values, bias):
    """The reference: one softmax over all the keys, in fp64."""
    scores = torch.matmul(q.double(), keys.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.matmul((scores + bias.double()).softmax(-1), values.double())


def test_attention_in_parts_merged_by_log_sum_exp_is_one_softmax(monkeypatch):
    # Keys split in three spans (two shared levels and the rows' own columns, some
    # masked): each attended apart and merged equals one softmax over them all, on the
    # fused CPU kernel and on the matmul path other devices take.
    torch.manual_seed(0)
    q, keys, values = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 11, 8), torch.randn(3, 2, 11, 8)
    bias = torch.zeros(3, 1, 4, 11)
    bias[0, :, :, 2:5] = float("-inf")  # padding inside a span
    bias[2, :, 1:, 9:] = float("-inf")
    expected = _full_attention(q, keys, values, bias)
    spans = [slice(0, 3), slice(3, 6), slice(6, 11)]
    for flash in (lean_decoder._FLASH_CPU, None):
        monkeypatch.setattr(lean_decoder, "_FLASH_CPU", flash)
        parts = [
            lean_decoder.attend_with_lse(q, keys[..., s, :], values[..., s, :], bias[..., s])
            for s in spans
        ]
        merged = lean_decoder.merge_parts(*map(list, zip(*parts, strict=True)))
        assert merged.dtype == torch.float32
        assert torch.allclose(merged.double(), expected, atol=1e-5)
        out, lse = lean_decoder.attend_with_lse(q, keys, values, bias)
        assert torch.allclose(out.double(), expected, atol=1e-5)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * 8**-0.5 + bias
        assert torch.allclose(lse, scores.logsumexp(-1), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_level_read_in_one_call_is_one_softmax_over_each_rows_tree(dtype):
    # Two levels: one block every row reads, then 3 blocks of which rows read 0 and 2 (3
    # readers and 1: padded slots), with masked columns; each row's attention over its
    # own tree (its blocks, then its own columns) equals one softmax over them.
    from starpo.rollout.backends.lean_kv_store import SharedLevel

    torch.manual_seed(1)
    rows, kv_heads, group, dim = 4, 2, 3, 8
    q = torch.randn(rows, kv_heads * group, 1, dim)

    def cache(blocks, columns):
        return torch.randn(blocks, kv_heads, columns, dim).to(dtype)

    levels = [
        SharedLevel([cache(1, 5)], [cache(1, 5)], torch.zeros(rows, dtype=torch.long)),
        SharedLevel([cache(3, 4)], [cache(3, 4)], torch.tensor([2, 0, 2, 2])),
    ]
    keys, values = cache(rows, 6), cache(rows, 6)
    attend = torch.ones(rows, 1, 1, 15, dtype=torch.bool)
    attend[1, :, :, 5:7] = False  # padding in row 1's case block
    attend[3, :, :, 12:] = False  # and in row 3's own columns
    bias = lean_decoder.attention_bias(attend, group)
    reads = lean_decoder.level_reads(levels, bias)
    assert reads[0].blocks is None and reads[1].blocks.tolist() == [0, 2]
    assert reads[1].slots.tolist() == [1, 1, 1, 0, 2, 3]  # block 0 padded to 3 readers
    parts = [
        lean_decoder.SharedPart(level.keys[0], level.values[0], read)
        for level, read in zip(levels, reads, strict=True)
    ]
    out = lean_decoder.attend_parts(q, kv_heads, keys, values, bias[..., 9:], parts)
    assert lean_decoder.kv_bytes_read(keys, parts) == 2 * dtype.itemsize * kv_heads * dim * (
        rows * 6 + 5 + 2 * 4
    )  # the unread case block is not read
    for row in range(rows):
        case = int(levels[1].rows[row])
        row_keys = torch.cat([levels[0].keys[0][0], levels[1].keys[0][case], keys[row]], dim=1)
        row_values = torch.cat(
            [levels[0].values[0][0], levels[1].values[0][case], values[row]], dim=1
        )
        grouped = q[row].reshape(kv_heads, group, dim)
        expected = _full_attention(
            grouped,
            row_keys.float(),
            row_values.float(),
            bias[row, :, :, :].expand(kv_heads, -1, -1),
        )
        got = out[row].reshape(kv_heads, group, dim)
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        assert torch.allclose(got.double(), expected, atol=tolerance), row


def test_kv_store_compaction_moves_each_rows_chosen_columns_to_the_front():
    store = KVStore(layers=2, rows=2, kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu")
    store.ensure(6)
    columns = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 1, 4, 2)
    for layer in range(2):
        store.write(layer, columns + 100 * layer, -columns)
    store.length = 4
    order = torch.tensor([[1, 3, 0, 2], [0, 1, 2, 3]])
    store.compact(order, 2)
    assert store.length == 2
    for layer in range(2):
        assert torch.equal(store.keys[layer][0, 0, :2], columns[0, 0, [1, 3]] + 100 * layer)
        assert torch.equal(store.values[layer][1, 0, :2], -columns[1, 0, :2])


def test_dropping_padding_changes_no_token_and_shortens_the_cache(tiny):
    # Rows stop at different steps (a third of the vocabulary ends a reply) and feed
    # chunks of different lengths over three turns: with the padding dropped before each
    # turn's decoding, the same tokens come out, log-probs within fp32 rounding, from a
    # cache that holds fewer columns.
    model, tokenizer = tiny
    stops = tuple(range(0, model.config.vocab_size, 3))
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop_token_ids=stops)
    runs = {}
    for drop in (False, True):
        backend = LeanBackend(model, pad_token_id=tokenizer.pad_token_id, seed=7)
        backend.drop_padding = drop
        requests = [GenerationRequest(i, list(p)) for i, p in enumerate(PROMPTS)]
        out = backend.generate(requests, params)
        for turn in range(2):
            chunks = [[30 + turn] * (1 + 3 * i) for i in range(len(PROMPTS))]
            out += backend.generate([GenerationRequest(i, c) for i, c in enumerate(chunks)], params)
        runs[drop] = (backend, out)
    (kept, plain), (dropped, lean) = runs[False], runs[True]
    assert len({len(g.token_ids) for g in plain}) > 1  # replies of different lengths
    assert [g.token_ids for g in lean] == [g.token_ids for g in plain]
    for a, b in zip(lean, plain, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert dropped._cache.length < kept._cache.length
    assert dropped._mask.shape == (len(PROMPTS), dropped._cache.length)
    assert torch.equal(dropped._mask.sum(1), kept._mask.sum(1))  # the same real columns


def _generate(model, tokenizer, kv_dtype, weights_dtype=torch.float32, prompts=SHARED_START):
    backend = LeanBackend(
        model, pad_token_id=tokenizer.pad_token_id, seed=5, weights_dtype=weights_dtype
    )
    backend.kv_dtype = kv_dtype
    requests = [GenerationRequest(i, list(p)) for i, p in enumerate(prompts)]
    first = backend.generate(requests, SamplingParams(max_new_tokens=8, temperature=0.0))
    second = backend.generate(
        [GenerationRequest(i, list(range(20, 40))[: 1 + 6 * i]) for i in range(4)],
        SamplingParams(max_new_tokens=8, temperature=0.0),
    )
    return backend, first + second


@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.bfloat16])
def test_a_bf16_cache_halves_its_bytes_and_stays_close(tiny, weights_dtype):
    # Shared blocks, a wide second-turn feed and decode steps, all on a bf16 cache: the
    # cache holds bf16, the backend says it is inexact, and greedy log-probs stay within
    # bf16 rounding of the fp32 cache's on the same tokens.
    model, tokenizer = tiny
    exact, plain = _generate(model, tokenizer, torch.float32, weights_dtype)
    low, halved = _generate(model, tokenizer, torch.bfloat16, weights_dtype)
    assert low._cache.keys[0].dtype == torch.bfloat16
    assert low._cache.levels[0].keys[0].dtype == torch.bfloat16
    assert 2 * low._cache.held_bytes() == exact._cache.held_bytes()
    assert low.numerics.exact_logprobs is False and low.numerics.cache_dtype == "bfloat16"
    assert "bfloat16 KV cache" in low.numerics.describe(2)
    assert exact.numerics.exact_logprobs is (weights_dtype == torch.float32)
    assert [g.token_ids for g in halved] == [g.token_ids for g in plain]
    gap = max(
        abs(a - b)
        for x, y in zip(halved, plain, strict=True)
        for a, b in zip(x.logprobs, y.logprobs, strict=True)
    )
    assert 0 < gap < 0.05


def test_only_the_lean_backend_takes_a_bf16_cache(tiny):
    from starpo.errors import UserError
    from starpo.rollout.backends.base import set_kv_dtype

    model, tokenizer = tiny
    hf = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    set_kv_dtype(hf, torch.float32)  # nothing to change
    with pytest.raises(UserError, match="rollout.kv_dtype=bfloat16: the HFBackend backend"):
        set_kv_dtype(hf, torch.bfloat16)
    lean = LeanBackend(model, pad_token_id=tokenizer.pad_token_id)
    set_kv_dtype(lean, torch.bfloat16)
    assert lean.kv_dtype == torch.bfloat16 and lean.lean.kv_dtype == torch.bfloat16
