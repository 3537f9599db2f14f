"""Training with Ray rollout workers logs what in-process training logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from starpo.runs.metrics import read_metrics
from starpo.trainer.loop import Trainer

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # end-to-end Trainer.train() runs


def _comparable(rows: list[dict]) -> list[dict]:
    skip = ("timing_s/", "perf/", "rollout/worker_restarts")
    return [{k: v for k, v in row.items() if not k.startswith(skip)} for row in rows]


def test_training_with_one_worker_logs_what_in_process_training_logs(
    ray_cluster, tmp_path: Path, bigram_model, make_bandit_config
):
    overrides = {"trainer.val_every": "2", "trainer.val_seeds": "8"}
    cfg = make_bandit_config("grpo", total_steps=2, **overrides)
    model, tokenizer = bigram_model()
    Trainer(cfg, tmp_path / "local", quiet=True, model=model, tokenizer=tokenizer).train()
    cfg = make_bandit_config("grpo", total_steps=2, **overrides, **{"rollout.workers": "1"})
    model, tokenizer = bigram_model()
    trainer = Trainer(cfg, tmp_path / "ray", quiet=True, model=model, tokenizer=tokenizer)
    history = trainer.train()
    assert trainer.pool is None and ray.is_initialized()  # workers gone, the cluster kept
    assert history[-1]["perf/weight_broadcast_mb"] > 0
    assert history[-1]["rollout/worker_restarts"] == 0
    local, remote = read_metrics(tmp_path / "local"), read_metrics(tmp_path / "ray")
    assert _comparable(remote) == _comparable(local)
