"""`starpo train` on an OpenEnv environment written with openenv-core (the way its own
authors write one), served by openenv-core's server on 127.0.0.1 and played as starpo's env
id `openenv`: in-process and by Ray rollout workers, one session per episode, each ended."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv.core")

from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serving import WAIT_S, running  # noqa: E402

from starpo.trainer.loop import Trainer  # noqa: E402


class PickAction(Action):
    choice: str


class PickObservation(Observation):
    prompt: str


class PickEnvironment(Environment):
    """An OpenEnv environment as its own authors would write it: pick Dragon (reward 1) or
    Phoenix (reward 0), one step. Counts the sessions it served."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    opened = 0
    closed = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).opened += 1
        self._state = State()

    def reset(self, seed=None, episode_id=None, **kwargs) -> PickObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return PickObservation(prompt="Two doors: Dragon and Phoenix.", done=False, reward=0.0)

    def step(self, action: PickAction, timeout_s=None, **kwargs) -> PickObservation:
        self._state.step_count += 1
        won = action.choice == "Dragon"
        return PickObservation(
            prompt=f"You opened {action.choice}.", done=True, reward=1.0 if won else 0.0
        )

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        type(self).closed += 1


PICK_KWARGS = (
    "{url: %s, action_key: choice, actions: [Dragon, Phoenix], "
    "instruction: 'Pick a door: Dragon or Phoenix.'}"
)


@pytest.fixture
def pick_server():
    PickEnvironment.opened = PickEnvironment.closed = 0
    app = create_fastapi_app(PickEnvironment, PickAction, PickObservation, max_concurrent_envs=64)
    with running(app) as url:
        yield url


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
    history = _train_on_pick(pick_server, tmp_path, bigram_model, make_bandit_config, {})
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
    extra = {"rollout.workers": "1"}
    history = _train_on_pick(pick_server, tmp_path, bigram_model, make_bandit_config, extra)
    assert [0.0 < row["train/openenv/success"] <= 1.0 for row in history] == [True, True]
    assert PickEnvironment.opened == 2 * 16
    wait_until(lambda: PickEnvironment.closed == PickEnvironment.opened, "every session to end")


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
