"""GiGPO end to end on real Sokoban rollouts: engine -> state keys -> batch -> advantages.

The math is tested against a naive reference in tests/algorithms/test_gigpo.py; this checks
the plumbing: the states the engine records recur where the scripted rollouts meet, and the
trainer's `prepare` credits those turns by their return from that state.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from starpo.algorithms import gigpo_advantages, grpo_advantages, pad_turns
from starpo.compute.batch import build_batch
from starpo.config import load_config
from starpo.models import load_tokenizer
from starpo.rollout.engine import EpisodeSettings, RolloutEngine
from starpo.trainer.prepare import prepare
from starpo.trainer.update_settings import UpdateSettings

# Level 10003 with one action a turn: sessions 0 and 1 share their first two moves, then
# part; session 2 starts differently and comes back (Up, Down) to the start state.
MOVES = {
    0: ["Left", "Left", "Up", "Up"],
    1: ["Left", "Left", "Down", "Right"],
    2: ["Up", "Down", "Left", "Left"],
    3: ["Right", "Left", "Right", "Left"],
}


def test_prepare_credits_recurring_sokoban_states(scripted_backend):
    tokenizer = load_tokenizer()

    def script(session: int, turn: int) -> str:
        return f"<answer>{MOVES[session % 4][turn - 1]}</answer><|im_end|>"

    settings = EpisodeSettings(max_turns=4, max_actions_per_turn=1, think=False)
    engine = RolloutEngine(scripted_backend(tokenizer, script), tokenizer, settings)
    trajectories = engine.run("sokoban", [10003, 10004], group_size=4)
    batch = build_batch(trajectories, tokenizer.pad_token_id, per_turn_rewards=False)
    cfg = load_config(
        None,
        [
            "algorithm.adv_estimator=gigpo",
            "algorithm.gamma_step=0.9",
            "rollout.num_groups=2",
            "rollout.group_size=4",
            "optim.mini_batch_size=8",
        ],
    )
    models = SimpleNamespace(
        precision=SimpleNamespace(autocast=contextlib.nullcontext), critic=None, actor=None
    )
    metrics = prepare(batch, models, UpdateSettings.of(cfg), recompute_old_logprobs=False)

    # Recorded keys, rebuilt independently of build_batch: states recur within each group.
    keys: dict[str, int] = {}
    states = [
        [keys.setdefault(turn.state_key, len(keys)) for turn in t.turns] for t in trajectories
    ]
    rewards = [[turn.reward for turn in t.turns] for t in trajectories]
    turn_rewards, turn_ends = pad_turns(rewards, [t.turn_ends for t in trajectories])
    turn_states = torch.full_like(turn_ends, -1)
    for row, row_states in enumerate(states):
        turn_states[row, : len(row_states)] = torch.tensor(row_states)
    assert all(row[0] == states[0][0] for row in states[:4])  # a group shares its start
    assert states[0][:2] == states[1][:2] and states[2][2] == states[0][0]  # back to the start
    expected = gigpo_advantages(
        batch.scores,
        batch.group_ids,
        turn_rewards,
        turn_ends,
        turn_states,
        batch.loss_mask,
        gamma_step=0.9,
    )
    torch.testing.assert_close(batch.advantages, expected)
    assert batch.returns is None
    assert 0.5 < metrics["rollout/recurring_state_share"] <= 1.0
    # Step-level credit: where returns from a shared state differ, GiGPO is not GRPO.
    grpo = grpo_advantages(batch.scores, batch.group_ids, batch.loss_mask)
    assert not torch.allclose(batch.advantages, grpo)
