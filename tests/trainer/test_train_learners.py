"""Data-parallel learners (trainer.learners=2, CPU, gloo) against one learner."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from run_metrics import comparable

from starpo.config import load_config
from starpo.errors import UserError
from starpo.runs.metrics import read_metrics
from starpo.trainer.loop import Trainer

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs


def test_two_learners_train_as_one_on_the_same_batches(
    ray_cluster, tmp_path: Path, bigram_model, make_bandit_config
):
    extra = {"trainer.val_every": "2", "trainer.val_seeds": "8", "trainer.save_every": "0"}
    results = {}
    for learners in (1, 2):
        cfg = make_bandit_config(
            "gae", total_steps=2, **extra, **{"trainer.learners": str(learners)}
        )
        model, tokenizer = bigram_model()
        trainer = Trainer(
            cfg, tmp_path / str(learners), quiet=True, model=model, tokenizer=tokenizer
        )
        trainer.train()
        assert trainer.learners is None  # the other learner is gone after train()
        results[learners] = (read_metrics(tmp_path / str(learners)), model.lm_head.weight.clone())
    (one, weight_one), (two, weight_two) = results[1], results[2]
    assert not torch.equal(weight_one, torch.zeros_like(weight_one))
    torch.testing.assert_close(weight_two, weight_one, rtol=1e-5, atol=1e-6)
    rows_one, rows_two = comparable(one), comparable(two)
    assert [sorted(r) for r in rows_two] == [sorted(r) for r in rows_one]
    for a, b in zip(rows_one, rows_two, strict=True):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_a_lost_learner_stops_the_run_with_one_line_and_resume_continues(
    ray_cluster, tmp_path: Path, bigram_model, make_bandit_config, monkeypatch
):
    from starpo.trainer import learners as learners_module

    extra = {"trainer.val_every": "0", "trainer.save_every": "1", "trainer.learners": "2"}
    cfg = make_bandit_config("grpo", total_steps=3, **extra)
    start_update = learners_module.Learners.start_update
    calls = []

    def start_then_lose_a_learner(self, batch, seed):
        start_update(self, batch, seed)
        calls.append(seed)
        if len(calls) == 2:  # in step 2's update, after step 1 was saved
            ray.kill(self.replicas[0])

    monkeypatch.setattr(learners_module.Learners, "start_update", start_then_lose_a_learner)
    model, tokenizer = bigram_model()
    started = time.monotonic()
    with pytest.raises(UserError) as lost:
        Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer).train()
    assert time.monotonic() - started < 100
    message = str(lost.value)
    assert "a learner was lost during the update of step 2" in message
    assert "--resume" in message and "step_" in message and "\n" not in message
    assert [m["step"] for m in read_metrics(tmp_path)] == [0, 1]  # step 2 never landed

    monkeypatch.setattr(learners_module.Learners, "start_update", start_update)
    model, tokenizer = bigram_model()
    Trainer(cfg, tmp_path, resume=True, quiet=True, model=model, tokenizer=tokenizer).train()
    assert [m["step"] for m in read_metrics(tmp_path)] == [0, 1, 2, 3]


def test_an_error_of_the_drivers_own_update_is_not_called_a_lost_learner(
    ray_cluster, tmp_path: Path, bigram_model, make_bandit_config, monkeypatch
):
    """Every RuntimeError used to read "a learner was lost"; with both learners alive, the
    driver's own error (here a fake out-of-memory) is raised as it is."""
    from starpo.trainer import workers

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr(workers, "ppo_update", out_of_memory)  # the learners' update
    cfg = make_bandit_config("grpo", total_steps=1, **{"trainer.learners": "2"})
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="not enough memory") as raised:
        trainer.train()
    assert not isinstance(raised.value, UserError)
    assert trainer.learners is None and time.monotonic() - started < 60


def test_workers_and_learners_beyond_the_clusters_cpus_stop_with_one_line(
    ray_cluster, tmp_path: Path, bigram_model, make_bandit_config, monkeypatch
):
    from starpo.distributed import cluster

    monkeypatch.setattr(cluster, "CPU_RELEASE_WAIT_S", 1.0)  # no CPU frees up here
    extra = {"rollout.workers": "2", "trainer.learners": "2"}  # 2 + 1 actors, 2 CPUs
    model, tokenizer = bigram_model()
    trainer = Trainer(
        make_bandit_config("grpo", total_steps=1, **extra),
        tmp_path,
        quiet=True,
        model=model,
        tokenizer=tokenizer,
    )
    started = time.monotonic()
    with pytest.raises(UserError, match=r"trainer.learners=2 .* needs 1 free CPUs .* 0 free of 2"):
        trainer.train()
    assert time.monotonic() - started < 60
    assert trainer.pool is None and trainer.learners is None and ray.is_initialized()
    deadline = time.monotonic() + 30  # Ray frees a killed actor's CPU a little later
    while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 2  # the workers were released


def test_learners_need_a_micro_batch_each():
    with pytest.raises(
        UserError, match=r"trainer.learners=4 .* makes 2; set trainer.learners=2 or"
    ):
        load_config(
            "cpu-tiny-smoke",
            ["trainer.learners=4", "optim.mini_batch_size=2", "optim.micro_batch_size=1"],
        )


@pytest.mark.parametrize("setting", ["trainer.learners=2", "rollout.workers=1"])
def test_gpu_runs_refuse_ray_workers_and_learners_they_do_not_have(setting):
    with pytest.raises(UserError, match=r"only so far.*model.device=cuda needs"):
        load_config("cpu-tiny-smoke", [setting, "model.device=cuda"])
