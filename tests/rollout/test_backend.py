"""Sampling and the HF backend's session bookkeeping."""

from __future__ import annotations

import pytest
import torch

from starpo.rollout.backends.base import (
    GenerationRequest,
    SamplingParams,
    ends_with_stop,
    first_stop,
)
from starpo.rollout.backends.hf import HFBackend, sample_tokens


def test_greedy_picks_argmax_and_reports_its_logprob():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, logprobs = sample_tokens(logits, 0.0, 1.0, None)
    assert tokens.tolist() == [1, 0]
    expected = torch.log_softmax(logits, -1)[[0, 1], [1, 0]]
    torch.testing.assert_close(logprobs, expected)


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    # probs 0.5, 0.3, 0.2: top_p=0.6 keeps {0, 1}; top_p=0.45 keeps {0}.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(2000, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits, 1.0, 0.6, gen)
    assert set(tokens.tolist()) == {0, 1}
    share = (tokens == 0).float().mean().item()
    assert abs(share - 0.5 / 0.8) < 0.05  # renormalised within the kept set
    torch.testing.assert_close(logprobs, torch.log(torch.tensor([0.5, 0.3]))[tokens])
    tokens, _ = sample_tokens(logits, 1.0, 0.45, gen)
    assert set(tokens.tolist()) == {0}


def test_temperature_sharpens_sampling():
    logits = torch.tensor([[1.0, 0.0]]).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    hot = (sample_tokens(logits, 2.0, 1.0, gen)[0] == 0).float().mean().item()
    cold = (sample_tokens(logits, 0.25, 1.0, gen)[0] == 0).float().mean().item()
    assert cold > 0.95 > hot > 0.55


def test_stop_tokens_and_sequences():
    params = SamplingParams(max_new_tokens=5, stop_token_ids=(2,), stop_sequences=((7, 8),))
    assert ends_with_stop([5, 2], params) == [2]
    assert ends_with_stop([1, 7, 8], params) == [7, 8]
    assert ends_with_stop([7, 1, 8], params) is None
    assert ends_with_stop([], params) is None


def test_the_stop_rule_a_backend_and_the_sft_replay_share():
    params = SamplingParams(
        max_new_tokens=9, stop_token_ids=(2, 3), stop_sequences=((), (8,), (7, 8), (1, 7, 8))
    )
    # A stop token comes before any sequence; among sequences the first listed wins, and
    # the empty one never matches.
    assert ends_with_stop([7, 3], params) == [3]
    assert ends_with_stop([1, 7, 8], params) == [8]
    assert ends_with_stop((9, 9), params) is None
    # `end` reads tokens[:end] without copying it; a sequence longer than that never fits.
    assert ends_with_stop([5, 2, 9], params, end=2) == [2]
    assert ends_with_stop([8, 9], params, end=0) is None
    only_pair = SamplingParams(max_new_tokens=9, stop_sequences=((7, 8),))
    assert ends_with_stop([8, 7, 8, 1], only_pair, end=1) is None
    assert ends_with_stop([8, 7, 8, 1], only_pair, end=3) == [7, 8]
    # first_stop: where sampling these tokens in order would end, the stop included.
    assert first_stop([5, 7, 8, 2, 8], only_pair) == (3, [7, 8])
    assert first_stop([5, 7, 2, 8], params) == (3, [2])
    assert first_stop([5, 6], params) is None and first_stop([], params) is None


def test_generation_stops_at_stop_tokens_and_budget(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    prompt = tokenizer.encode("hello there", add_special_tokens=False)
    (free,) = backend.generate(
        [GenerationRequest(0, prompt)], SamplingParams(max_new_tokens=6, temperature=0)
    )
    assert free.finish_reason == "length" and len(free.token_ids) == 6
    backend.reset()
    # Stop on a token the greedy run produces: generation ends at its first occurrence.
    stop = free.token_ids[-1]
    expected = free.token_ids[: free.token_ids.index(stop) + 1]
    params = SamplingParams(max_new_tokens=6, temperature=0, stop_token_ids=(stop,))
    (stopped,) = backend.generate([GenerationRequest(0, prompt)], params)
    assert stopped.finish_reason == "stop" and stopped.token_ids == expected
    assert stopped.stop_ids == [stop]


def test_sessions_must_start_together_and_can_be_released(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    params = SamplingParams(max_new_tokens=2, temperature=0)
    backend.generate([GenerationRequest(0, [5, 6]), GenerationRequest(1, [7])], params)
    with pytest.raises(ValueError, match="one generate"):
        backend.generate([GenerationRequest(1, [8]), GenerationRequest(2, [9])], params)
    backend.release([0])
    (only,) = backend.generate([GenerationRequest(1, [8])], params)
    assert len(only.token_ids) == 2
    with pytest.raises(ValueError, match="at least one new token"):
        backend.generate([GenerationRequest(5, [])], params)
