"""Sessions with the same history read one cache row (`HFBackend.share_histories`): an
exact speed-up, so episodes must come out the same as with a row per session, token for
token, log-probs within fp32 rounding, on both backends."""

from __future__ import annotations

import copy

import pytest
import torch

from starpo.rollout import EpisodeSettings, RolloutEngine
from starpo.rollout.backends.base import GenerationRequest, SamplingParams
from starpo.rollout.backends.hf import HFBackend
from starpo.rollout.backends.lean import LeanBackend


@pytest.fixture(scope="module")
def peaked(tiny):
    """The tiny random model with its logits scaled up: sampling at temperature 1 then
    picks among a few tokens, so episodes of a group agree often and differ sometimes
    (a uniform random model would never repeat itself, a greedy one always). Scale 12
    gives both within four turns; 10 makes every episode distinct, 14 none."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.model.norm.weight.mul_(12.0)  # the LM head reads the final norm's output
    return model, tokenizer


def _play(peaked, backend_class, share: bool, temperature: float = 1.0, env_id: str = "sokoban"):
    model, tokenizer = peaked
    backend = backend_class(
        model, pad_token_id=tokenizer.pad_token_id, seed=7, share_histories=share
    )
    # top_p 0.9 keeps draws off the far tail, where two tokens of ~1e-8 probability sit
    # next to each other in the cumulative sum and a float32 rounding between a batched
    # and a single-row forward can flip which one a uniform lands on: a legitimate
    # difference of the same size as any batch-size change, not a sharing error.
    settings = EpisodeSettings(max_turns=4, max_new_tokens=6, temperature=temperature, top_p=0.9)
    engine = RolloutEngine(backend, tokenizer, settings)
    return engine.run(env_id, [10000, 10001, 10002], 6), backend


@pytest.mark.parametrize(
    "backend_class, env_id",
    # invoice: a tool env, whose long first prompt (the tools) a group shares
    [(HFBackend, "sokoban"), (LeanBackend, "sokoban"), (LeanBackend, "invoice")],
)
def test_shared_histories_play_the_same_episodes_as_a_row_each(peaked, backend_class, env_id):
    shared, shared_backend = _play(peaked, backend_class, share=True, env_id=env_id)
    alone, alone_backend = _play(peaked, backend_class, share=False, env_id=env_id)
    assert [t.token_ids for t in shared] == [t.token_ids for t in alone]
    for a, b in zip(shared, alone, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    # The case is a real one: some histories were shared and some rows forked.
    assert shared_backend.rows_fed < alone_backend.rows_fed
    # ...and at some turn of some group, episodes had diverged while others still agreed.
    assert any(1 < n < 6 for n in distinct_histories(shared))


def distinct_histories(trajectories) -> list[int]:
    """Distinct dialogues up to the end of each turn, per group and turn."""
    counts = []
    for group in {t.group for t in trajectories}:
        members = [t for t in trajectories if t.group == group]
        for k in range(max(len(t.turn_ends) for t in members)):
            heads = {tuple(t.token_ids[: t.turn_ends[k] + 1]) for t in members if len(t.turns) > k}
            counts.append(len(heads))
    return counts


@pytest.mark.parametrize("backend_class", [HFBackend, LeanBackend])
def test_greedy_groups_are_encoded_once_per_group(peaked, backend_class):
    """At temperature 0 a group's episodes are identical: each turn feeds one row per
    group, where a row per session feeds one per episode. Both modes feed the prompts
    the same way (the common start once, then one row per distinct prompt: 4 rows)."""
    shared, backend = _play(peaked, backend_class, share=True, temperature=0.0)
    alone, alone_backend = _play(peaked, backend_class, share=False, temperature=0.0)
    assert [t.token_ids for t in shared] == [t.token_ids for t in alone]
    prompt_rows = 1 + 3
    assert alone_backend.rows_fed - prompt_rows == 6 * (backend.rows_fed - prompt_rows)


def test_released_and_forked_rows_keep_each_sessions_own_history(peaked):
    """A released session's row is dropped, a shared row forks on different chunks, and
    every session continues exactly as it would in a row of its own."""
    model, tokenizer = peaked
    params = SamplingParams(max_new_tokens=5, temperature=1.0, top_p=0.9)
    prompts = [[1, 5, 7, 9, 11] * 4] * 3 + [[2, 3, 4]]

    def calls(share: bool):
        backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id, seed=1)
        backend.share_histories = share
        first = backend.generate([GenerationRequest(i, p) for i, p in enumerate(prompts)], params)
        backend.release([1])
        chunks = {0: [20, 21], 2: [20], 3: [20, 21]}
        second = backend.generate([GenerationRequest(i, c) for i, c in chunks.items()], params)
        return first + second

    shared, alone = calls(True), calls(False)
    assert [g.token_ids for g in shared] == [g.token_ids for g in alone]
    for a, b in zip(shared, alone, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_the_rollout_setting_reaches_the_backend_and_is_refused_where_unsupported(tiny):
    from starpo.errors import UserError
    from starpo.rollout.backends.base import set_share_histories

    model, tokenizer = tiny
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id)
    assert backend.share_histories is False  # off by default: forks copy every row's cache
    set_share_histories(backend, True)
    assert backend.share_histories is True

    class PlainBackend:  # a registered backend without the switch
        pass

    set_share_histories(PlainBackend(), False)  # off: nothing to do
    with pytest.raises(UserError, match="rollout.share_histories=false"):
        set_share_histories(PlainBackend(), True)
