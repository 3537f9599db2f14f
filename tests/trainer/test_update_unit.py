"""Small pieces of the update stage, without a model: chunked row maps, micro-batch metric
merging, the consecutive-skip counter, and the rollout/training log-prob mismatch."""

from __future__ import annotations

import pytest
import torch

from starpo.algorithms import masked_mean
from starpo.compute.batch import TrainBatch
from starpo.errors import UserError
from starpo.trainer.prepare import logprob_mismatch, map_rows
from starpo.trainer.update import NonFiniteUpdates, SkipCounter, _merge

LENGTHS = [2, 3, 6, 4, 5]  # real tokens per row; the batch is padded to 6


def _batch(lengths: list[int] = LENGTHS) -> TrainBatch:
    n, width = len(lengths), max(lengths)
    g = torch.Generator().manual_seed(0)
    attention = (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).long()  # (B, T)
    input_ids = torch.randint(1, 1000, (n, width), generator=g) * attention
    loss_mask = attention.float() * (torch.rand(n, width, generator=g) < 0.7)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        rollout_logprobs=torch.zeros(n, width),
        token_rewards=torch.zeros(n, width),
        turn_rewards=torch.zeros(n, 1),
        turn_ends=torch.full((n, 1), -1),
        scores=torch.zeros(n),
        group_ids=torch.arange(n),
    )


def _per_token(b: TrainBatch) -> torch.Tensor:
    """A row-local function of the tokens (0 on padding), returning a long tensor."""
    return (b.input_ids * 3 + torch.arange(b.input_ids.shape[1]) + 1) * b.attention_mask


# ------------------------------------------------------------------------ map_rows


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8])
def test_map_rows_stitches_chunks_into_the_unchunked_result(chunk):
    batch = _batch()
    got = map_rows(batch, chunk, _per_token)
    assert got.shape == batch.loss_mask.shape
    assert got.dtype == batch.loss_mask.dtype  # cast to the batch's float dtype
    assert torch.equal(got, _per_token(batch).to(got.dtype))


def test_map_rows_calls_fn_on_trimmed_consecutive_chunks():
    batch = _batch()
    seen = []

    def record(b: TrainBatch) -> torch.Tensor:
        seen.append((b.group_ids.tolist(), b.input_ids.shape[1]))
        return _per_token(b)

    map_rows(batch, 2, record)
    # Rows in order, two at a time; each chunk only as wide as its longest row.
    assert seen == [([0, 1], 3), ([2, 3], 6), ([4], 5)]


# ------------------------------------------------------------------------ _merge


def test_merge_takes_the_max_of_max_keys_and_a_token_weighted_mean_of_the_rest():
    merged = _merge(
        [
            (2.0, {"actor/pg_loss": 1.0, "rollout/logprob_diff_max": 0.5}),
            (6.0, {"actor/pg_loss": 3.0, "rollout/logprob_diff_max": 0.2}),
        ]
    )
    assert merged["actor/pg_loss"] == pytest.approx((2 * 1.0 + 6 * 3.0) / 8)
    assert merged["rollout/logprob_diff_max"] == 0.5


def test_merge_max_of_negative_values_is_not_zero():
    merged = _merge([(1.0, {"x_max": -3.0}), (5.0, {"x_max": -5.0})])
    assert merged["x_max"] == -3.0


def test_merged_micro_batch_token_means_equal_the_mini_batch_token_mean():
    g = torch.Generator().manual_seed(1)
    values = torch.randn(7, 9, generator=g)  # (B, T)
    mask = (torch.rand(7, 9, generator=g) < 0.6).float()
    parts = [
        (float(mask[rows].sum()), {"m": float(masked_mean(values[rows], mask[rows]))})
        for rows in (slice(0, 3), slice(3, 5), slice(5, 7))
    ]
    assert _merge(parts)["m"] == pytest.approx(float(masked_mean(values, mask)), rel=1e-6)


def test_merge_of_one_part_is_that_part():
    assert _merge([(4.0, {"a": 1.5, "b_max": 2.0})]) == pytest.approx({"a": 1.5, "b_max": 2.0})


# ------------------------------------------------------------------------ SkipCounter


def test_skip_counter_stops_after_limit_consecutive_skips():
    counter = SkipCounter(limit=3)
    counter.record(True)
    counter.record(True)
    assert counter.consecutive == 2
    with pytest.raises(NonFiniteUpdates, match="3 consecutive updates") as caught:
        counter.record(True)
    assert isinstance(caught.value, UserError)  # a one-line message, no traceback
    assert "optim.max_skipped_updates" in str(caught.value)


def test_skip_counter_resets_on_a_good_update():
    counter = SkipCounter(limit=3)
    for _ in range(3):
        counter.record(True)
        counter.record(True)
        counter.record(False)  # two skips, then a success: never three in a row
        assert counter.consecutive == 0
    counter.record(True)
    assert counter.consecutive == 1


def test_skip_counter_resumes_from_a_checkpointed_count():
    counter = SkipCounter(limit=2, consecutive=1)
    with pytest.raises(NonFiniteUpdates):
        counter.record(True)


# ------------------------------------------------------------------------ logprob_mismatch


def test_logprob_mismatch_reads_agent_tokens_only():
    train = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.0, -4.5], [-0.2, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # On the mask: |diff| = 0.5, 0.0, 0.1; off it 4.0 and 2.0, which must not count.
    metrics = logprob_mismatch(train, rollout, mask)
    assert set(metrics) == {"rollout/logprob_diff_mean", "rollout/logprob_diff_max"}
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(0.6 / 3)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(0.5)


def test_logprob_mismatch_is_symmetric_and_zero_without_agent_tokens():
    a, b = torch.randn(2, 4), torch.randn(2, 4)
    mask = torch.ones(2, 4)
    assert logprob_mismatch(a, b, mask) == logprob_mismatch(b, a, mask)
    empty = logprob_mismatch(a, b, torch.zeros(2, 4))
    assert empty == {"rollout/logprob_diff_mean": 0.0, "rollout/logprob_diff_max": 0.0}
