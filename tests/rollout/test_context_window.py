"""Context-window modes (`rollout.context_window`): what each turn's prompt shows, the
tokens a trajectory records for training, and that a row of several sequences trains as
those sequences would on their own."""

from __future__ import annotations

import pytest
import torch

from starpo.compute.batch import build_batch
from starpo.compute.forward import policy_logprobs
from starpo.compute.segments import segment_ids, split_parts
from starpo.config.episode import EpisodeSettings
from starpo.errors import UserError
from starpo.models import load_tokenizer
from starpo.rollout.backends.base import Generation, GenerationRequest, SamplingParams
from starpo.rollout.backends.hf import HFBackend
from starpo.rollout.backends.lean import LeanBackend
from starpo.rollout.engine import RolloutEngine
from starpo.types import Trajectory

REPLY = " go </think><answer>Up || Left</answer><|im_end|>"


class PromptRecorder:
    """Replies REPLY to every request and keeps each session's fed sequence, which starts
    afresh when the engine resets the backend (as a real backend's KV cache does)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.sequences: dict[int, list[int]] = {}
        self.prompts: list[dict[int, list[int]]] = []  # per call: session -> whole context
        self.resets = 0

    def generate(self, requests: list[GenerationRequest], params: SamplingParams):
        out, seen = [], {}
        for r in requests:
            sequence = self.sequences.setdefault(r.session, [])
            sequence.extend(r.new_token_ids)
            seen[r.session] = list(sequence)
            ids = self.tokenizer.encode(REPLY, add_special_tokens=False)
            sequence.extend(ids)
            out.append(Generation(ids, [-0.5] * len(ids), "stop", ids[-1:]))
        self.prompts.append(seen)
        return out

    def release(self, sessions) -> None:
        list(sessions)

    def reset(self) -> None:
        self.sequences.clear()
        self.resets += 1


def _play(window: str, turns: int = 4, kept: int = 1) -> tuple[Trajectory, PromptRecorder]:
    tokenizer = load_tokenizer()
    backend = PromptRecorder(tokenizer)
    settings = EpisodeSettings(
        max_turns=turns, max_actions_per_turn=2, context_window=window, context_turns=kept
    )
    (traj,) = RolloutEngine(backend, tokenizer, settings).run("sokoban", [10003], group_size=1)
    return traj, backend


def _parts(traj: Trajectory) -> list[list[int]]:
    bounds = [0, *traj.context_resets, len(traj.token_ids)]
    return [traj.token_ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def test_full_window_keeps_one_growing_sequence():
    traj, backend = _play("full")
    assert traj.context_resets == [] and [t.window_start for t in traj.turns] == [1, 1, 1, 1]
    assert backend.resets == 2  # the engine's own reset before and after the run only


def test_single_turn_prompts_show_the_task_and_the_current_state_only():
    traj, backend = _play("single_turn", turns=3)
    tokenizer = load_tokenizer()
    assert [t.window_start for t in traj.turns] == [1, 2, 3]
    assert len(traj.context_resets) == 2
    for turn, part in enumerate(_parts(traj), start=1):
        text = tokenizer.decode(part)
        assert text.count("<|im_start|>user") == 1 and f"Turn {turn}:" in text
        assert "Your available actions are" in text and "Reward:" not in text
        assert traj.turns[turn - 1].state in text
        # the prompt the backend was sent is this part up to the reply
        prompt = backend.prompts[turn - 1][0]
        assert part[: len(prompt)] == prompt and sum(traj.loss_mask[len(prompt) :]) > 0


def test_last_k_keeps_the_task_and_the_last_k_turns():
    traj, backend = _play("last_k", turns=4, kept=1)
    tokenizer = load_tokenizer()
    assert [t.window_start for t in traj.turns] == [1, 1, 2, 3]
    parts = _parts(traj)
    assert len(parts) == 3  # turns 1-2 share the opening sequence; 3 and 4 start afresh
    third = tokenizer.decode(parts[1])
    assert "Turn 1:" not in third and "Turn 2:" in third and "Turn 3:" in third
    assert third.count("<|im_start|>assistant") == 2  # turn 2's reply, then turn 3's
    assert third.index("Your available actions are") < third.index("Turn 2:")
    # The rebuilt prompt carries turn 2's reply as its own tokens (never re-tokenised), as
    # context: it is trained once, in the part it was generated in.
    reply2 = parts[0][-traj.turns[1].response_tokens :]
    third_start = traj.context_resets[0]
    found = [i for i in range(len(parts[1])) if parts[1][i : i + len(reply2)] == reply2]
    assert len(found) == 2  # as context, then as turn 3's own reply (the same words)
    at = third_start + found[0]
    assert traj.loss_mask[at : at + len(reply2)] == [0] * len(reply2)
    assert sum(traj.loss_mask) == sum(t.response_tokens for t in traj.turns)


def test_context_turns_and_window_are_checked():
    with pytest.raises(UserError, match="context_window must be one of"):
        EpisodeSettings(context_window="recent")
    with pytest.raises(UserError, match="context_turns must be >= 1"):
        EpisodeSettings(context_window="last_k", context_turns=0)


# ------------------------------------------------------------------ rows of several parts


def test_segment_ids_and_parts_as_rows_of_their_own():
    ids = segment_ids([[3], []], width=6)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]]
    assert segment_ids([[], []], width=4) is None
    tokens = torch.tensor([[10, 11, 12, 13, 14, 0], [20, 21, 22, 23, 24, 25]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    parts = split_parts(tokens, attention, ids)
    assert parts.ids.tolist() == [
        [10, 11, 12, 0, 0, 0],
        [13, 14, 0, 0, 0, 0],
        [20, 21, 22, 23, 24, 25],
    ]
    assert parts.attention_mask.sum(dim=1).tolist() == [3, 2, 6]
    flat = parts.ids.flatten()
    assert torch.equal(flat[parts.index[:, :5]], tokens[:, :5])  # every real token read back
    assert flat[parts.index[0, 5]] == 14  # padding reads its row's last token


def _run_tiny(tiny, window: str, backend_class=HFBackend, seed: int = 0) -> list[Trajectory]:
    model, tokenizer = tiny
    backend = backend_class(model, pad_token_id=tokenizer.pad_token_id, seed=seed)
    settings = EpisodeSettings(
        max_turns=3, max_new_tokens=10, temperature=0.8, context_window=window, context_turns=1
    )
    return RolloutEngine(backend, tokenizer, settings).run("sokoban", [10000, 10001], 2)


@pytest.mark.parametrize("window", ["single_turn", "last_k"])
def test_rollout_logprobs_are_each_parts_own_forward(tiny, window):
    model, _ = tiny
    for traj in _run_tiny(tiny, window, seed=5):
        assert traj.context_resets
        starts = [0, *traj.context_resets]
        for a, b in zip(starts, [*traj.context_resets, len(traj.token_ids)], strict=True):
            ids = torch.tensor([traj.token_ids[a:b]])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, :-1].float() / 0.8
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(traj.loss_mask[a + 1 : b], dtype=torch.bool)
            recorded = torch.tensor(traj.logprobs[a + 1 : b])
            assert mask.sum() > 0
            torch.testing.assert_close(recorded[mask], logprobs[mask], atol=1e-4, rtol=0)


def test_lean_and_hf_backends_play_windows_alike(tiny):
    hf = _run_tiny(tiny, "last_k", HFBackend, seed=2)
    lean = _run_tiny(tiny, "last_k", LeanBackend, seed=2)
    assert [t.token_ids for t in hf] == [t.token_ids for t in lean]
    assert [t.context_resets for t in hf] == [t.context_resets for t in lean]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_row_of_several_parts_trains_as_each_part_alone(tiny, attention):
    """The invariance the update relies on: a trajectory's parts in one row give the same
    log-probs (and gradients) as each part in a row of its own."""
    model, tokenizer = tiny
    before, model.config._attn_implementation = model.config._attn_implementation, attention
    try:
        trajectories = _run_tiny(tiny, "single_turn", seed=7)
        batch = build_batch(trajectories, tokenizer.pad_token_id, per_turn_rewards=False)
        assert batch.segment_ids is not None
        joined, _ = policy_logprobs(model, batch, 0.8, with_entropy=False)
        for row, traj in enumerate(trajectories):
            starts = [0, *traj.context_resets]
            for a, b in zip(starts, [*traj.context_resets, len(traj.token_ids)], strict=True):
                alone = Trajectory(env_id=traj.env_id, seed=traj.seed, group=0)
                alone.token_ids = traj.token_ids[a:b]
                alone.loss_mask = traj.loss_mask[a:b]
                alone.logprobs = traj.logprobs[a:b]
                single = build_batch([alone], tokenizer.pad_token_id, per_turn_rewards=False)
                own, _ = policy_logprobs(model, single, 0.8, with_entropy=False)
                torch.testing.assert_close(joined[row, a:b], own[0], atol=1e-5, rtol=0)
    finally:
        model.config._attn_implementation = before


def test_critic_values_of_a_row_of_several_parts_are_each_parts_own(tiny):
    from starpo.trainer.train_models import ValueModel

    model, tokenizer = tiny
    critic = ValueModel(model.model, model.config.hidden_size)
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)  # zero-initialised otherwise
    trajectories = _run_tiny(tiny, "single_turn", seed=4)
    batch = build_batch(trajectories, tokenizer.pad_token_id, per_turn_rewards=False)
    assert batch.segment_ids is not None  # rows of several parts
    with torch.no_grad():
        joined = critic(batch) * batch.loss_mask
        for row, traj in enumerate(trajectories):
            starts = [0, *traj.context_resets]
            for a, b in zip(starts, [*traj.context_resets, len(traj.token_ids)], strict=True):
                alone = Trajectory(env_id=traj.env_id, seed=traj.seed, group=0)
                alone.token_ids = traj.token_ids[a:b]
                alone.loss_mask = traj.loss_mask[a:b]
                alone.logprobs = traj.logprobs[a:b]
                single = build_batch([alone], tokenizer.pad_token_id, per_turn_rewards=False)
                own = critic(single) * single.loss_mask
                torch.testing.assert_close(joined[row, a:b], own[0], atol=1e-5, rtol=0)


def test_logits_of_a_row_of_several_parts_match_their_hidden_states(tiny):
    """`logits_at` (models without a plain head) reads the same parts as `hidden_at`, which
    the test above checks against each part alone; logits only where they are read."""
    from starpo.compute.forward import hidden_at, logits_at

    model, tokenizer = tiny
    trajectories = _run_tiny(tiny, "last_k", seed=6)
    batch = build_batch(trajectories, tokenizer.pad_token_id, per_turn_rewards=False)
    positions = torch.nonzero(batch.loss_mask.any(dim=0)).squeeze(1) - 1
    with torch.no_grad():
        logits = logits_at(model, batch, positions)
        expected = model.lm_head(hidden_at(model, batch, positions))
    assert logits.shape == (len(batch), len(positions), model.config.vocab_size)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
