"""experiments/frozenlake_drift.py: the score is the policy's log-prob gradient, a step
with no reward spread pushes nothing, a lone success raises its own moves, and a policy
that follows the map beats one that ignores it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from starpo.envs.frozenlake.env import FrozenLakeEnv

_SPEC = importlib.util.spec_from_file_location(
    "frozenlake_drift", Path(__file__).parents[1] / "experiments" / "frozenlake_drift.py"
)
frozenlake_drift = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(frozenlake_drift)
UNIFORM = frozenlake_drift.tilted(0.25)
NO_GOOD = np.zeros(4)


def test_episode_score_is_the_gradient_of_the_episodes_log_probability():
    turns = [(0, np.array([1.0, 0, 0, 1])), (0, NO_GOOD), (2, np.array([0, 1.0, 1, 0]))]
    logits = torch.tensor(frozenlake_drift.tilted(0.4), requires_grad=True)
    lean = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    log_prob = sum(
        torch.log_softmax(logits + lean * torch.tensor(good), dim=0)[move] for move, good in turns
    )
    log_prob.backward()
    score = frozenlake_drift.episode_score(turns, logits.detach().numpy(), 0.7)
    np.testing.assert_allclose(score[:4], logits.grad.numpy())
    assert score[4] == pytest.approx(lean.grad.item())


@pytest.mark.parametrize("loss_agg", ["seq_mean_token_mean", "token_mean"])
def test_groups_without_reward_spread_push_nothing(loss_agg):
    turns = [(0, NO_GOOD), (1, NO_GOOD)]
    episodes = [(0.0, turns), (0.0, turns[:1]), (1.0, turns), (1.0, turns * 2)]
    push = frozenlake_drift.step_push(episodes, 2, UNIFORM, 0.0, loss_agg)
    np.testing.assert_array_equal(push, np.zeros(5))


@pytest.mark.parametrize("loss_agg", ["seq_mean_token_mean", "token_mean"])
def test_a_lone_success_raises_its_moves_and_the_lean_when_they_were_good(loss_agg):
    # One group: the success moved Right twice (good there), the failures Left (not good).
    good_right = np.array([0, 0, 1.0, 0])
    episodes = [(1.0, [(2, good_right)] * 2), (0.0, [(0, good_right)] * 2)] + [
        (0.0, [(0, good_right)] * 2)
    ]
    push = frozenlake_drift.step_push(episodes, 3, UNIFORM, 0.0, loss_agg)
    assert push[2] > 0 > push[0]
    assert push[1] == pytest.approx(push[3])
    assert push[:4].sum() == pytest.approx(0.0, abs=1e-12)  # a shift of all logits: no change
    assert push[4] > 0


def test_leaning_to_good_moves_wins_more_than_ignoring_the_map():
    env, rng = FrozenLakeEnv(is_slippery=False), np.random.default_rng(0)
    wins = {
        lean: sum(frozenlake_drift.play(env, seed, UNIFORM, lean, rng, 10)[0] for seed in range(60))
        for lean in (0.0, 3.0)
    }
    assert wins[3.0] > wins[0.0] + 10  # random play wins ~23%, a strong lean most maps


def test_the_table_has_a_row_per_policy_and_aggregation(capsys):
    frozenlake_drift.main(
        ["--maps", "2", "--tries", "2", "--steps", "3", "--shares", "0.25", "0.6"]
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row.split("|")[1:3]] for row in rows[1:]]
    aggs = ("seq_mean_token_mean", "token_mean")
    assert cells == [
        [f"Left {share}, lean 0: push on Left", agg] for share in ("25%", "60%") for agg in aggs
    ] + [["uniform, lean 0: push on the lean", agg] for agg in aggs]
    assert "nan" not in " ".join(rows)


@pytest.mark.parametrize("argv", [["--shares", "1.5"], ["--shares", "0.1"], ["--tries", "1"]])
def test_bad_arguments_get_a_one_line_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        frozenlake_drift.main(argv)
    assert exit_info.value.code == 2
    assert "error: --" in capsys.readouterr().err
