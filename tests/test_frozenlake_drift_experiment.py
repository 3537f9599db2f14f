"""experiments/frozenlake_drift.py: the map-blind score is the softmax log-prob gradient,
a step with no reward spread pushes nothing, and a lone success raises its own moves."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

_SPEC = importlib.util.spec_from_file_location(
    "frozenlake_drift", Path(__file__).parents[1] / "experiments" / "frozenlake_drift.py"
)
frozenlake_drift = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(frozenlake_drift)


def test_logit_score_is_the_gradient_of_the_episodes_log_probability():
    probs = frozenlake_drift.tilted(0.4)
    moves = [0, 0, 2, 3]
    logits = torch.tensor(np.log(probs), requires_grad=True)
    torch.log_softmax(logits, dim=0)[moves].sum().backward()
    np.testing.assert_allclose(frozenlake_drift.logit_score(moves, probs), logits.grad.numpy())


@pytest.mark.parametrize("loss_agg", ["seq_mean_token_mean", "token_mean"])
def test_groups_without_reward_spread_push_nothing(loss_agg):
    episodes = [(0.0, [0, 1, 2]), (0.0, [3]), (1.0, [2, 2]), (1.0, [1, 0, 0, 0])]
    push = frozenlake_drift.step_push(episodes, 2, frozenlake_drift.tilted(0.25), loss_agg)
    np.testing.assert_array_equal(push, np.zeros(4))


@pytest.mark.parametrize("loss_agg", ["seq_mean_token_mean", "token_mean"])
def test_a_lone_success_raises_its_moves_and_lowers_the_failures(loss_agg):
    # One group: the success moved Right twice, the failures Left; Down and Up unused.
    episodes = [(1.0, [2, 2]), (0.0, [0, 0]), (0.0, [0, 0])]
    push = frozenlake_drift.step_push(episodes, 3, frozenlake_drift.tilted(0.25), loss_agg)
    assert push[2] > 0 > push[0]
    assert push[1] == pytest.approx(push[3])
    assert push.sum() == pytest.approx(0.0, abs=1e-12)  # softmax logits: a shift is no change


def test_the_table_has_a_row_per_marginal_and_aggregation(capsys):
    frozenlake_drift.main(
        ["--maps", "2", "--tries", "2", "--steps", "3", "--shares", "0.25", "0.6"]
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| Left")]
    cells = [[cell.strip() for cell in row.split("|")[1:3]] for row in rows]
    assert cells == [
        [f"Left {share}", agg]
        for share in ("25%", "60%")
        for agg in ("seq_mean_token_mean", "token_mean")
    ]
    assert "nan" not in " ".join(rows)


@pytest.mark.parametrize("argv", [["--shares", "1.5"], ["--shares", "0.1"], ["--tries", "1"]])
def test_bad_arguments_get_a_one_line_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        frozenlake_drift.main(argv)
    assert exit_info.value.code == 2
    assert "error: --" in capsys.readouterr().err
