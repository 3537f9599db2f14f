"""experiments/frozenlake_lean.py: the prefix cache reads what a full forward pass reads,
the AUC and lean are the textbook quantities, and the probe finds a planted feature."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

_SPEC = importlib.util.spec_from_file_location(
    "frozenlake_lean", Path(__file__).parents[1] / "experiments" / "frozenlake_lean.py"
)
frozenlake_lean = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(frozenlake_lean)


def test_first_turns_are_rollout_prompts_with_the_solvers_good_moves():
    turns = frozenlake_lean.first_turns(range(123, 133))
    assert 5 <= len(turns) <= 10  # maps whose goal is out of reach are left out
    for user, good in turns:
        assert "Turn 1:\nState:\n" in user and "You have 10 actions left." in user
        assert good.shape == (4,) and 1 <= good.sum() <= 2  # one or two moves lead closer


def test_the_prefix_cache_reads_what_a_full_forward_pass_reads(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    users = [user for user, _ in frozenlake_lean.first_turns(range(123, 127))]
    probs, hidden = frozenlake_lean.read_model(str(tiny_model_dir), users)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    chat = frozenlake_lean.ChatTokens(tokenizer, "<answer>")
    move_ids = [
        tokenizer.encode(" " + m, add_special_tokens=False)[0] for m in frozenlake_lean.MOVES
    ]
    layers = model.config.num_hidden_layers
    for i, user in enumerate(users):
        ids = torch.tensor([chat.first_prompt(frozenlake_lean.prompts.SYSTEM_PROMPT, user)])
        with torch.inference_mode():
            out = model(ids, output_hidden_states=True)
        expected = torch.softmax(out.logits[0, -1, move_ids], dim=0).numpy()
        np.testing.assert_allclose(probs[i], expected, rtol=1e-4, atol=1e-6)
        last = out.hidden_states[layers][0, -1].numpy()
        np.testing.assert_allclose(hidden[1.0][i], last, rtol=1e-4, atol=1e-5)


def test_auc_and_lean_are_the_textbook_quantities():
    labels = np.array([0, 0, 1, 1])
    assert frozenlake_lean.auc(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert frozenlake_lean.auc(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert frozenlake_lean.auc(np.zeros(4), labels) == 0.5
    good = np.array([[1.0, 0, 0, 0], [0, 1.0, 1.0, 0]])
    assert frozenlake_lean.lean_points(np.full((2, 4), 0.25), good) == pytest.approx((0.0, 0.0))
    on_good = np.array([[1.0, 0, 0, 0], [0, 0.5, 0.5, 0]])
    mean, se = frozenlake_lean.lean_points(on_good, good)  # per map: 75 and 50 points
    assert mean == pytest.approx(62.5) and se == pytest.approx(12.5)


def test_the_probe_finds_a_planted_feature_and_not_a_shuffled_one():
    rng = np.random.default_rng(0)
    good = (rng.random((240, 4)) < 0.4).astype(float)
    features = rng.normal(size=(240, 32))
    features[:, :4] += 2.0 * good  # each move's label leaks into one feature
    assert frozenlake_lean.probe_auc(features, good) > 0.75  # the best rule: 0.92
    assert frozenlake_lean.probe_auc(features, rng.permutation(good)) < 0.65


@pytest.mark.parametrize(
    "argv, message", [(["x", "--maps", "10"], ">= 30"), (["no-such-dir"], "no model")]
)
def test_bad_arguments_get_a_one_line_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        frozenlake_lean.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
