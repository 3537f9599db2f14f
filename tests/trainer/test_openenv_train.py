"""`starpo train` on an OpenEnv environment written with openenv-core (the way its own
authors write one), served by openenv-core's server on 127.0.0.1 and played as starpo's env
id `openenv`: in-process and by Ray rollout workers, one session per episode, each ended."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serving import WAIT_S, running  # noqa: E402

from starpo.trainer.loop import Trainer  # noqa: E402

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None, reason="needs starpo[openenv]"
)


PICK_KWARGS = (
    "{url: %s, action_key: choice, actions: [Dragon, Phoenix], "
    "instruction: 'Pick a door: Dragon or Phoenix.'}"
)


@pytest.fixture
def pick_server():
    """PickEnvironment (tests/serve/pick_env.py) on openenv-core's server: (url, the class)."""
    from pick_env import PickEnvironment, pick_app

    with running(pick_app()) as url:
        yield url, PickEnvironment


def _train_on_pick(url, tmp_path, bigram_model, make_bandit_config, extra: dict[str, str]):
    cfg = make_bandit_config(
        "grpo",
        total_steps=2,
        **{
            "env.id": "openenv",
            "env.kwargs": PICK_KWARGS % url,
            "trainer.val_every": "0",
            "trainer.val_before_train": "false",
            "trainer.save_every": "0",
            **extra,
        },
    )
    model, tokenizer = bigram_model()
    return Trainer(cfg, tmp_path, quiet=True, model=model, tokenizer=tokenizer).train()


def test_trains_two_steps_on_an_openenv_environment_written_with_openenv_core(
    pick_server, tmp_path, bigram_model, make_bandit_config
):
    url, PickEnvironment = pick_server
    history = _train_on_pick(url, tmp_path, bigram_model, make_bandit_config, {})
    assert len(history) == 2
    for row in history:
        assert 0.0 < row["train/openenv/success"] <= 1.0  # the bigram policy picks both doors
        assert row["train/openenv/success"] == row["train/openenv/reward"]  # 1 = a win
        assert row["train/openenv/env_errors"] == 0
    assert PickEnvironment.opened == 2 * 16  # one session per episode
    wait_until(lambda: PickEnvironment.closed == PickEnvironment.opened, "every session to end")


@pytest.mark.slow
def test_ray_rollout_workers_play_an_openenv_environment(
    pick_server, ray_cluster, tmp_path, bigram_model, make_bandit_config
):
    url, PickEnvironment = pick_server
    extra = {"rollout.workers": "1"}
    history = _train_on_pick(url, tmp_path, bigram_model, make_bandit_config, extra)
    assert [0.0 < row["train/openenv/success"] <= 1.0 for row in history] == [True, True]
    assert PickEnvironment.opened == 2 * 16
    wait_until(lambda: PickEnvironment.closed == PickEnvironment.opened, "every session to end")


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
