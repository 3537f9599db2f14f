"""The same command trains the same run, resumed or not: the embedded 135M model on the
demo's bandit preset logs bitwise the same metrics and ends with the same weights whether
it runs two steps straight or is resumed from its step-1 checkpoint (a copy of the
straight run's folder cut back to step 1: its step-2 metrics line stays behind, as a run
killed before its step-2 checkpoint leaves it, and the resume must drop it).

Tiny test models never showed the race this guards against (their batches are too small
for the CPU's parallel kernels); the real model at the demo's batch shape did, within one
step, until the packed forward's gather became an `index_select` (see `gather_rows`)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch
from run_metrics import comparable

from starpo.config import load_config
from starpo.runs.metrics import read_metrics
from starpo.trainer.loop import Trainer

pytestmark = pytest.mark.slow  # three steps of the real default model (~1 min)

OVERRIDES = [
    "rollout.num_groups=4",  # 4 seeds x 8 rollouts; the top half by reward std is kept:
    "filter.ratio=0.5",  # 16 trajectories in one micro-batch, as the demo's 32
    "optim.mini_batch_size=16",
    "optim.micro_batch_size=16",
    "trainer.total_steps=2",
    "trainer.val_before_train=false",
    "trainer.val_every=0",
    "trainer.save_every=1",
    "trainer.keep_checkpoints=2",
    "trainer.tensorboard=false",
    "trainer.log_trajectories=0",
]


def test_the_demo_preset_trains_bitwise_the_same_straight_and_resumed(
    tmp_path: Path, default_model
):
    model, tokenizer = default_model
    cfg = load_config("cpu-bandit-starpo-s", OVERRIDES)

    def trainer(folder: Path, resume: bool = False) -> tuple[Trainer, torch.nn.Module]:
        policy = copy.deepcopy(model)  # what a fresh process would load
        run = Trainer(cfg, folder, resume=resume, quiet=True, model=policy, tokenizer=tokenizer)
        return run, policy

    straight, straight_policy = trainer(tmp_path / "straight")
    straight.train()
    metrics = comparable(read_metrics(tmp_path / "straight"))
    assert [r["step"] for r in metrics] == [1, 2]

    # The straight run's folder, renamed rather than copied (its checkpoints of the real
    # model hold GBs: CI's disk ran out with both), cut back as a kill before step 2 leaves it.
    split = (tmp_path / "straight").rename(tmp_path / "split")
    shutil.rmtree(split / "checkpoints" / "step_000002")
    shutil.rmtree(split / "final")
    resumed, resumed_policy = trainer(split, resume=True)
    resumed.train()

    assert comparable(read_metrics(split)) == metrics
    weights, again = straight_policy.state_dict(), resumed_policy.state_dict()
    assert all(torch.equal(again[k], weights[k]) for k in weights)
