"""Training goes on past an env that raises: the group is left out and counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from starpo.envs import register
from starpo.envs.bandit import BanditEnv
from starpo.errors import UserError
from starpo.runs.metrics import read_metrics
from starpo.trainer.loop import Trainer

pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs


class StepFailsOnSomeSeeds(BanditEnv):
    """The bandit, whose step raises for seeds in `failing` (one group of a step)."""

    failing: set[int] = {10001}

    def reset(self, *, seed=None, options=None):
        self.seed_ = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.seed_ in self.failing:
            raise RuntimeError("plugin bug")
        return super().step(action)


register("bandit-failing", StepFailsOnSomeSeeds, overwrite=True)


def _trainer(folder: Path, bigram_model, make_bandit_config, **extra: str) -> Trainer:
    """One GRPO step of the bigram bandit on `bandit-failing` (validation on the bandit)."""
    overrides = {"env.id": "bandit-failing", "env.val_id": "bandit", **extra}
    model, tokenizer = bigram_model()
    cfg = make_bandit_config("grpo", total_steps=1, **overrides)
    return Trainer(cfg, folder, quiet=True, model=model, tokenizer=tokenizer)


def test_a_group_with_an_env_error_is_left_out_and_training_goes_on(
    tmp_path: Path, bigram_model, make_bandit_config
):
    extra = {"filter.enabled": "false"}
    history = _trainer(tmp_path, bigram_model, make_bandit_config, **extra).train()
    step = history[-1]
    assert step["rollout/env_errors"] == 4  # seed 10001's group of 4 (of 16 episodes)
    assert step["rollout/kept_trajectories"] == 12  # the other 3 groups trained
    assert read_metrics(tmp_path)[-1]["step"] == 1


def test_too_many_env_errors_stop_the_run_with_one_line(
    tmp_path: Path, bigram_model, make_bandit_config
):
    extra = {"env.max_error_share": "0.1"}
    trainer = _trainer(tmp_path, bigram_model, make_bandit_config, **extra)
    with pytest.raises(UserError, match=r"env errors ended 4 of 16 episodes at step 1, above "):
        trainer.train()
