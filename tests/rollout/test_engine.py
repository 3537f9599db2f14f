"""The rollout engine: scripted multi-turn episodes, token masks, cache reuse, log-probs."""

from __future__ import annotations

import math
import re

import pytest
import torch

from starpo.envs import make
from starpo.evaluation.summary import summarise
from starpo.models import load_tokenizer
from starpo.rollout.backends.hf import HFBackend
from starpo.rollout.engine import EpisodeSettings, RolloutEngine
from starpo.types import Trajectory


def _full_plan(env) -> list[str]:
    plan = []
    while not env.done:
        action = env.optimal_action()
        plan.append(action)
        env.step(action)
    return plan


def test_scripted_solver_policy_plays_multi_turn_sokoban(scripted_backend):
    """A fake policy that answers with the solver's plan, 2 actions a turn, always wins."""
    tokenizer = load_tokenizer()
    seeds = [10000, 10001, 10002]
    plans = {i: _plan_for(seed) for i, seed in enumerate(seeds)}

    def script(session: int, turn: int) -> str:
        chunk = plans[session][2 * (turn - 1) : 2 * turn]
        return f" go </think><answer>{' || '.join(chunk)}</answer><|im_end|>"

    settings = EpisodeSettings(max_actions_per_turn=2, max_turns=5, max_actions_per_traj=10)
    engine = RolloutEngine(scripted_backend(tokenizer, script), tokenizer, settings)
    trajectories = engine.run("sokoban", seeds, group_size=1)
    for i, traj in enumerate(trajectories):
        plan = plans[i]
        assert traj.success and traj.done
        assert len(traj.turns) == math.ceil(len(plan) / 2)
        assert [a for t in traj.turns for a in t.executed] == plan
        assert all(t.format_ok and t.num_invalid == 0 for t in traj.turns)
        assert traj.env_reward == pytest.approx(10 + 1 - 0.1 * len(plan))
        assert traj.reward == pytest.approx(traj.env_reward)  # no format penalty
        assert traj.turns[0].think == "go"


def _plan_for(seed: int) -> list[str]:
    env = make("sokoban")
    env.reset(seed=seed)
    return _full_plan(env)


def test_format_penalty_and_invalid_actions(scripted_backend):
    tokenizer = load_tokenizer()
    replies = {1: "no tags at all<|im_end|>", 2: " x</think><answer>Jump || Up</answer><|im_end|>"}
    engine = RolloutEngine(
        scripted_backend(tokenizer, lambda s, t: replies.get(t, replies[1])),
        tokenizer,
        EpisodeSettings(max_turns=2),
    )
    (traj,) = engine.run("sokoban", [10000], group_size=1)
    first, second = traj.turns
    assert not first.format_ok and first.reward == pytest.approx(-0.1) and first.executed == []
    assert second.format_ok and second.num_invalid == 1 and second.executed == ["Up"]
    assert second.reward == pytest.approx(second.env_reward - 0.1)
    assert first.format_penalty == second.format_penalty == pytest.approx(-0.1)
    assert len(traj.turns) == 2 and not traj.done


def test_group_members_share_the_seed_and_the_initial_state(scripted_backend):
    tokenizer = load_tokenizer()
    engine = RolloutEngine(
        scripted_backend(tokenizer, lambda s, t: "<|im_end|>"),
        tokenizer,
        EpisodeSettings(max_turns=1),
    )
    trajectories = engine.run("frozenlake", [5, 6], group_size=3)
    assert [t.group for t in trajectories] == [0, 0, 0, 1, 1, 1]
    assert [t.seed for t in trajectories] == [5, 5, 5, 6, 6, 6]
    assert len({t.turns[0].state for t in trajectories[:3]}) == 1


def test_token_sequence_is_the_chat_template_and_mask_covers_agent_tokens(scripted_backend):
    """Fed chunks + generated tokens == the chat template's tokenisation of the messages, and
    the loss mask selects exactly the agent's generated tokens."""
    tokenizer = load_tokenizer()
    reply = " hmm </think><answer>Up || Left</answer><|im_end|>"
    engine = RolloutEngine(
        scripted_backend(tokenizer, lambda s, t: reply),
        tokenizer,
        EpisodeSettings(max_turns=3, max_actions_per_turn=2),
    )
    (traj,) = engine.run("sokoban", [10003], group_size=1)
    assert traj.messages[0]["role"] == "system" and traj.messages[-1]["role"] == "assistant"
    rendered = tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in traj.messages], tokenize=False
    )
    # The template closes the last assistant turn with "<|im_end|>\n"; the agent wrote the
    # "<|im_end|>" itself and the trailing newline is not fed until a next turn would start.
    assert tokenizer.decode(traj.token_ids) + "\n" == rendered
    assert tokenizer.encode(rendered, add_special_tokens=False)[:-1] == traj.token_ids
    agent_tokens = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert tokenizer.decode(agent_tokens) == reply * len(traj.turns)
    for end in traj.turn_ends:
        assert traj.loss_mask[end] == 1 and (
            end + 1 == len(traj.loss_mask) or traj.loss_mask[end + 1] == 0
        )


def _run_tiny(tiny, reuse_cache: bool, temperature: float, seed: int = 0) -> list[Trajectory]:
    model, tokenizer = tiny
    backend = HFBackend(
        model, pad_token_id=tokenizer.pad_token_id, seed=seed, reuse_cache=reuse_cache
    )
    settings = EpisodeSettings(max_turns=3, max_new_tokens=12, temperature=temperature)
    return RolloutEngine(backend, tokenizer, settings).run("sokoban", [10000, 10001], 2)


def test_greedy_outputs_equal_with_and_without_cache_reuse(tiny):
    reused = _run_tiny(tiny, reuse_cache=True, temperature=0.0)
    fresh = _run_tiny(tiny, reuse_cache=False, temperature=0.0)
    assert all(len(t.turns) == 3 for t in reused)  # multi-turn: the random model never wins
    assert [t.token_ids for t in reused] == [t.token_ids for t in fresh]
    for a, b in zip(reused, fresh, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_recorded_logprobs_match_a_fresh_forward_pass(tiny):
    model, _ = tiny
    temperature = 0.7
    for traj in _run_tiny(tiny, reuse_cache=True, temperature=temperature, seed=3):
        ids = torch.tensor([traj.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float() / temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(traj.loss_mask[1:], dtype=torch.bool)
        recorded = torch.tensor(traj.logprobs[1:])
        assert mask.sum() > 0
        torch.testing.assert_close(recorded[mask], logprobs[mask], atol=1e-4, rtol=0)
        assert torch.all(recorded[~mask] == 0)


def test_sampling_is_reproducible_per_seed(tiny):
    first = _run_tiny(tiny, reuse_cache=True, temperature=1.0, seed=11)
    again = _run_tiny(tiny, reuse_cache=True, temperature=1.0, seed=11)
    other = _run_tiny(tiny, reuse_cache=True, temperature=1.0, seed=12)
    assert [t.token_ids for t in first] == [t.token_ids for t in again]
    assert [t.token_ids for t in first] != [t.token_ids for t in other]


def test_trajectory_json_round_trip(tiny):
    traj = _run_tiny(tiny, reuse_cache=True, temperature=1.0)[0]
    assert Trajectory.from_json(traj.to_json()) == traj


@pytest.mark.slow
def test_real_model_plays_one_bandit_episode(default_model):
    """Smoke test on the embedded SmolLM2-135M-Instruct."""
    model, tokenizer = default_model
    backend = HFBackend(model, pad_token_id=tokenizer.pad_token_id, seed=0)
    settings = EpisodeSettings(max_turns=1, max_new_tokens=24, temperature=0.5)
    (traj,) = RolloutEngine(backend, tokenizer, settings).run("bandit", [123], 1)
    assert len(traj.turns) == 1
    turn = traj.turns[0]
    assert turn.response.startswith("<think>") and len(turn.response) > len("<think>")
    assert 0 < turn.response_tokens <= 24 and sum(traj.loss_mask) == turn.response_tokens


def test_format_reward_shapes_well_formed_turns(scripted_backend):
    tokenizer = load_tokenizer()
    replies = {1: "garbage<|im_end|>", 2: " x</think><answer>Jump</answer><|im_end|>"}
    engine = RolloutEngine(
        scripted_backend(tokenizer, lambda s, t: replies[t]),
        tokenizer,
        EpisodeSettings(max_turns=2, format_reward=0.3),
    )
    (traj,) = engine.run("sokoban", [10000], group_size=1)
    malformed, wrong_action = traj.turns
    assert malformed.format_bonus == 0.0 and malformed.reward == pytest.approx(-0.1)
    assert wrong_action.format_bonus == 0.3 and wrong_action.reward == pytest.approx(0.2)


# ------------------------------------------------------------------ the action budget
def _play(scripted_backend, replies: dict[int, str], **settings) -> Trajectory:
    """One Sokoban episode (seed 10000, env budget 10) whose turn t answers `replies[t]`."""
    tokenizer = load_tokenizer()
    answers = {t: f" x</think><answer>{a}</answer><|im_end|>" for t, a in replies.items()}
    engine = RolloutEngine(
        scripted_backend(tokenizer, lambda s, t: answers[t]),
        tokenizer,
        EpisodeSettings(**settings),
    )
    (traj,) = engine.run("sokoban", [10000], group_size=1)
    return traj


def _actions_left_shown(traj: Trajectory) -> list[int]:
    """The K of "You have K actions left" in each user message."""
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    return [int(re.search(r"You have (\d+) actions left\.", u).group(1)) for u in users]


def test_prompt_states_the_per_turn_cap_and_the_valid_actions_left(scripted_backend):
    """N in "up to N actions" is max_actions_per_turn; K counts only valid actions used, so
    "Foo || Up" costs one action of the trajectory budget, not two."""
    traj = _play(
        scripted_backend,
        {1: "Foo || Up", 2: "Down"},
        max_turns=2,
        max_actions_per_turn=3,
        max_actions_per_traj=7,
    )
    first_user = traj.messages[1]["content"]
    assert "You can make up to 3 actions, separated by ||." in first_user
    assert _actions_left_shown(traj) == [7, 6]
    first, second = traj.turns
    assert first.executed == ["Up"] and (first.num_valid, first.num_invalid) == (1, 1)
    assert first.format_penalty == pytest.approx(-0.1)  # the attempted "Foo" was invalid
    assert second.executed == ["Down"] and traj.num_actions == 3


def test_invalid_action_does_not_crowd_out_the_last_valid_one(scripted_backend):
    """With one action left, "Foo || Up" still executes Up, which spends the budget."""
    traj = _play(scripted_backend, {1: "Foo || Up"}, max_turns=3, max_actions_per_traj=1)
    (turn,) = traj.turns  # the budget is spent: the episode ends after one turn
    assert turn.executed == ["Up"] and (turn.num_valid, turn.num_invalid) == (1, 1)


def test_actions_past_the_budget_are_not_attempted_nor_judged(scripted_backend):
    traj = _play(scripted_backend, {1: "Up || Foo || Down"}, max_turns=3, max_actions_per_traj=1)
    (turn,) = traj.turns
    assert turn.executed == ["Up"] and (turn.num_valid, turn.num_invalid) == (1, 0)
    assert turn.format_penalty == 0.0 and turn.reward == pytest.approx(turn.env_reward)


def test_all_invalid_turns_leave_the_budget_untouched(scripted_backend):
    """Two all-invalid turns would spend a budget of 2 if invalid actions counted."""
    traj = _play(
        scripted_backend,
        {1: "Foo || Bar", 2: "Jump", 3: "Up || Left || Down"},
        max_turns=3,
        max_actions_per_traj=2,
    )
    assert len(traj.turns) == 3 and _actions_left_shown(traj) == [2, 2, 2]
    assert [t.num_invalid for t in traj.turns] == [2, 1, 0]
    assert all(t.format_penalty == pytest.approx(-0.1) for t in traj.turns[:2])
    assert traj.turns[2].executed == ["Up", "Left"]  # the budget of 2 stops before "Down"


def test_each_turn_records_the_state_key_it_started_from(scripted_backend):
    """Turn.state_key is the digest of env.state_key() before the turn's actions: equal in a
    group at turn 1, equal again where scripted rollouts meet the same state."""
    from starpo.envs.base import state_digest

    tokenizer = load_tokenizer()
    moves = {0: ["Up", "Down"], 1: ["Down", "Down"], 2: ["Up", "Down"]}  # sessions 0, 2 alike

    def script(session: int, turn: int) -> str:
        return f"<answer>{moves[session][turn - 1]}</answer><|im_end|>"

    settings = EpisodeSettings(max_turns=2, max_actions_per_turn=1, think=False)
    engine = RolloutEngine(scripted_backend(tokenizer, script), tokenizer, settings)
    trajectories = engine.run("sokoban", [10003], group_size=3)
    env = make("sokoban")
    env.reset(seed=10003)
    for traj in trajectories:
        assert traj.turns[0].state_key == state_digest(env.state_key())
        assert all(turn.state_key == state_digest(turn.state) for turn in traj.turns)
    keys = [[turn.state_key for turn in traj.turns] for traj in trajectories]
    assert keys[0] == keys[2]
    assert Trajectory.from_json(trajectories[0].to_json()).turns[1].state_key == keys[0][1]


def test_format_reminder_only_in_the_first_turn_when_asked(scripted_backend):
    from starpo.rollout.prompts import format_instruction

    tokenizer = load_tokenizer()
    reply = "<answer>Up</answer><|im_end|>"
    runs = {}
    for every in (True, False):
        settings = EpisodeSettings(max_turns=3, think=False, format_every_turn=every)
        engine = RolloutEngine(scripted_backend(tokenizer, lambda s, t: reply), tokenizer, settings)
        (runs[every],) = engine.run("sokoban", [10003], group_size=1)
    reminder = format_instruction(think=False, max_response_words=100)
    users = {k: [m["content"] for m in t.messages if m["role"] == "user"] for k, t in runs.items()}
    assert all(reminder in text for text in users[True])
    assert reminder in users[False][0] and not any(reminder in t for t in users[False][1:])
    assert [u.replace(" " + reminder, "") for u in users[True][1:]] == users[False][1:]
    assert len(runs[False].token_ids) < len(runs[True].token_ids)
    assert [t.executed for t in runs[False].turns] == [t.executed for t in runs[True].turns]


def test_turns_count_the_moves_the_solver_judges(scripted_backend):
    """A turn counts its valid actions the env judged (`good_actions`) and the optimal ones
    among them; invalid actions are not judged, and the summary turns counts into a rate."""
    env = make("sokoban")
    env.reset(seed=10000)
    good = sorted(env.good_actions())[0]
    bad = next(a for a in env.action_names if a not in env.good_actions())
    for reply, optimal in ((f"{good} || Foo", 1), (bad, 0)):
        traj = _play(scripted_backend, {1: reply}, max_turns=1, max_actions_per_turn=2)
        (turn,) = traj.turns
        assert (turn.num_valid, turn.num_judged, turn.num_optimal) == (1, 1, optimal)
        assert summarise([traj])["optimal_action_rate"] == optimal
