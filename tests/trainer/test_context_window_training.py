"""Training on multi-turn Sokoban in each context-window mode (`rollout.context_window`):
the rows the update sees, a PPO step with a critic and a KL term, and the same update
whichever micro-batch size splits the rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from starpo.config import load_config
from starpo.models import tiny_random_model
from starpo.trainer.loop import Trainer
from starpo.types import Trajectory

pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs


def sokoban_config(window: str, *extra: str):
    return load_config(
        None,
        [
            "env.id=sokoban",
            "rollout.num_groups=2",
            "rollout.group_size=2",
            "rollout.max_turns=3",
            "rollout.max_new_tokens=8",
            f"rollout.context_window={window}",
            "rollout.context_turns=1",
            "algorithm.adv_estimator=gae",
            "algorithm.kl_coef=0.01",
            "optim.mini_batch_size=4",
            "optim.micro_batch_size=2",
            "trainer.total_steps=1",
            "trainer.val_every=0",
            "trainer.val_before_train=false",
            "trainer.save_every=0",
            "trainer.tensorboard=false",
            *extra,
        ],
    )


@pytest.mark.parametrize("window", ["full", "last_k", "single_turn"])
def test_each_window_trains_a_ppo_step_with_critic_and_kl(tmp_path: Path, window: str):
    model, tokenizer = tiny_random_model(seed=0)
    trainer = Trainer(
        sokoban_config(window), tmp_path, quiet=True, model=model, tokenizer=tokenizer
    )
    (last,) = trainer.train()
    assert all(math.isfinite(v) for v in last.values() if isinstance(v, float)), last
    records = (tmp_path / "trajectories" / "step_000001.jsonl").read_text().splitlines()
    assert records
    first = Trajectory.from_json(records[0])
    expected = {"full": [1, 1, 1], "last_k": [1, 1, 2], "single_turn": [1, 2, 3]}[window]
    assert [t.window_start for t in first.turns] == expected[: len(first.turns)]
    assert bool(first.context_resets) == (window != "full" and len(first.turns) == 3)


def test_a_windowed_update_is_the_same_for_any_micro_batch_size(tmp_path: Path):
    weights = []
    for micro in ("1", "4"):
        model, tokenizer = tiny_random_model(seed=0)
        cfg = sokoban_config("single_turn", f"optim.micro_batch_size={micro}")
        Trainer(cfg, tmp_path / micro, quiet=True, model=model, tokenizer=tokenizer).train()
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, atol=2e-6, rtol=1e-5)
