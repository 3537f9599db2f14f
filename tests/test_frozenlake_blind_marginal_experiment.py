"""experiments/frozenlake_blind_marginal.py: the move mix is read from saved episodes, and
a blind policy's success is what drawing from that mix scores, map unseen."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from starpo.envs.frozenlake.env import ACTIONS, FrozenLakeEnv

_SPEC = importlib.util.spec_from_file_location(
    "frozenlake_blind_marginal",
    Path(__file__).parents[1] / "experiments" / "frozenlake_blind_marginal.py",
)
blind = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(blind)


def test_the_move_mix_counts_every_action_and_ignores_what_is_no_move():
    episodes = [
        {"turns": [{"actions": ["Up", "Up"]}, {"actions": ["Left"]}]},
        {"turns": [{"actions": ["Jump"]}, {"actions": []}, {"actions": ["Up"]}]},
    ]
    assert blind.move_mix(episodes) == {"Left": 0.25, "Down": 0.0, "Right": 0.0, "Up": 0.75}
    with pytest.raises(ValueError, match="no FrozenLake action"):
        blind.move_mix([{"turns": [{"actions": ["Jump"]}]}])


def test_a_mix_of_one_move_scores_what_always_making_it_scores():
    seeds = list(range(60))
    for action in ACTIONS:
        env, wins = FrozenLakeEnv(is_slippery=False), 0
        for seed in seeds:
            env.reset(seed=seed)
            done, info = False, {}
            while not done:
                _, _, terminated, truncated, info = env.step(action)
                done = terminated or truncated
            wins += bool(info.get("success"))
        mix = {a: float(a == action) for a in ACTIONS}
        assert blind.blind_success(mix, seeds, samples=3) == wins / len(seeds)


def test_the_uniform_mix_plays_at_the_random_policys_level():
    uniform = dict.fromkeys(ACTIONS, 0.25)
    assert 0.1 < blind.blind_success(uniform, list(range(100)), samples=10) < 0.4
    assert blind.blind_success(uniform, [1, 2], 5, seed=3) == blind.blind_success(
        uniform, [1, 2], 5, seed=3
    )
