"""An env that raises or hangs ends only its own episode, and never hangs the engine."""

from __future__ import annotations

import time

import pytest

from starpo.envs import register
from starpo.envs.bandit import BanditEnv
from starpo.errors import UserError
from starpo.models import load_tokenizer
from starpo.rollout.engine import EnvFault, EpisodeSettings, RolloutEngine, call_env
from starpo.trainer.episodes import check_env_errors
from starpo.types import Trajectory


class FaultyBandit(BanditEnv):
    """The bandit, except: seed % 4 == 1 raises in step, seed % 4 == 2 raises in reset,
    seed % 4 == 3 hangs in step."""

    def reset(self, *, seed=None, options=None):
        self.fault = None if seed is None else seed % 4
        if self.fault == 2:
            raise OSError("reset failed")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.fault == 1:
            raise RuntimeError("boom")
        if self.fault == 3:
            time.sleep(30)  # far past the test's timeout; the thread is abandoned
        return super().step(action)


register("faulty-bandit", FaultyBandit, overwrite=True)


def _engine(scripted_backend, timeout_s: float) -> RolloutEngine:
    tokenizer = load_tokenizer()
    backend = scripted_backend(tokenizer, lambda s, t: "Dragon</answer><|im_end|>")
    settings = EpisodeSettings(max_turns=1, think=False, env_timeout_s=timeout_s)
    return RolloutEngine(backend, tokenizer, settings)


def test_a_raising_or_hanging_env_ends_only_its_episodes(scripted_backend):
    engine = _engine(scripted_backend, timeout_s=0.5)
    started = time.monotonic()
    trajectories = engine.run("faulty-bandit", [100, 101, 102, 103], group_size=2)
    assert time.monotonic() - started < 10  # two hung steps cost 0.5 s each, not 30
    errors = {t.seed: t.error for t in trajectories}
    assert errors[100] is None
    assert errors[101] == "step: RuntimeError: boom"
    assert errors[102] == "reset: OSError: reset failed"
    assert errors[103] == "step: no answer within env_timeout_s=0.5 s"
    healthy = [t for t in trajectories if t.seed == 100]
    assert all(t.turns and t.turns[0].executed == ["Dragon"] for t in healthy)
    assert all(not t.turns and not t.success for t in trajectories if t.seed == 102)
    assert all(t.error is None or not t.success for t in trajectories)
    assert '"error": "step: RuntimeError: boom"' in trajectories[2].to_json()
    from starpo.evaluation.summary import summarise

    assert summarise(trajectories)["env_errors"] == 6  # `starpo eval` and val/<env>/ count them
    from starpo.viewer.data import normalise_trajectory

    assert normalise_trajectory(trajectories[2])["error"] == "step: RuntimeError: boom"
    assert normalise_trajectory(trajectories[0])["error"] is None  # the page shows it


def test_without_a_limit_a_raising_env_is_still_an_errored_episode(scripted_backend):
    engine = _engine(scripted_backend, timeout_s=0)
    (trajectory,) = engine.run("faulty-bandit", [101], group_size=1)
    assert trajectory.error == "step: RuntimeError: boom"


def test_call_env_returns_or_names_the_fault():
    assert call_env("step", lambda: 3, 1.0) == 3
    with pytest.raises(EnvFault, match=r"^reset: ValueError: bad$"):
        call_env("reset", lambda: (_ for _ in ()).throw(ValueError("bad")), 1.0)


def _episodes(groups: list[list[str | None]]) -> list[Trajectory]:
    return [
        Trajectory(env_id="e", seed=g, group=g, error=error)
        for g, errors in enumerate(groups)
        for error in errors
    ]


def test_env_errors_are_counted_below_the_share_and_stop_the_run_above_it():
    assert check_env_errors(_episodes([[None, None], [None, None]]), 0.25, 1) == 0
    assert check_env_errors(_episodes([[None, "x"], [None, None]]), 0.25, 1) == 1
    with pytest.raises(UserError, match=r"env errors ended 2 of 4 episodes at step 7, above "):
        check_env_errors(_episodes([["boom", "x"], [None, None]]), 0.25, 7)
    with pytest.raises(UserError, match=r"every env group had an env error at step 3"):
        check_env_errors(_episodes([["x", None, None, None], ["y", None, None, None]]), 0.5, 3)
