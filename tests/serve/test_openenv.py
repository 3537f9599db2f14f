"""OpenEnv both ways, with real servers on 127.0.0.1: starpo envs served by openenv-core's
server (`starpo serve-env`) and played by openenv-core's own client; and OpenEnv servers
played as starpo's env id `openenv` by the rollout engine (tests/trainer/test_openenv_train.py
trains on one written with openenv-core). Every wait is bounded. openenv-core is imported
by the tests, not at collection: importing it takes seconds, on every pytest worker."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import requests
from serving import WAIT_S, free_port, running

from starpo.cli import main
from starpo.config.episode import EpisodeSettings
from starpo.envs import make
from starpo.rollout.backends.hf import HFBackend
from starpo.rollout.engine import RolloutEngine

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("openenv") is None, reason="needs starpo[openenv]"
)


def build_env_app(*args, **kwargs):
    from starpo.serve.env_server import build_env_app

    return build_env_app(*args, **kwargs)


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def active_sessions(url: str) -> int:
    return requests.get(f"{url}/sessions", timeout=WAIT_S).json()["active"]


def client(url: str, connect: bool = True):
    from openenv.core import GenericEnvClient

    session = GenericEnvClient(base_url=url, message_timeout_s=WAIT_S).sync()
    return session.connect() if connect else session


# ----------------------------------------------------------- starpo envs, served
@pytest.mark.parametrize("env_id", ["sokoban", "frozenlake", "countdown", "invoice"])
def test_openenv_client_plays_a_served_env_as_it_plays_locally(env_id):
    local = make(env_id)
    with running(build_env_app(env_id)) as url:
        remote = client(url)
        try:
            for seed in (0, 7):
                text, _ = local.reset(seed=seed)
                result = remote.reset(seed=seed)
                assert result.observation["text"] == text and not result.done
                assert result.observation["action_names"] == list(local.action_names)
                assert result.observation["instruction"] == local.instruction
                rng = np.random.default_rng(seed)  # not the env's own generator
                answers = ["", "  "] + [local.sample_action(rng) for _ in range(8)]
                for answer in answers:
                    if local.done:
                        break
                    text, reward, terminated, truncated, info = local.step(answer)
                    result = remote.step({"action": answer})
                    obs = result.observation
                    assert (obs["text"], result.reward) == (text, reward)
                    assert result.done == (terminated or truncated)
                    assert obs["truncated"] == truncated and obs["success"] == info["success"]
                    assert obs["action_is_valid"] == info["action_is_valid"]
                    assert obs["action"] == info["action"]
                    assert obs["action_is_optimal"] == info.get("action_is_optimal")
                    good = None if local.done else local.good_actions()
                    assert obs["good_actions"] == (None if good is None else sorted(good))
                    assert obs["tool_result"] == info.get("tool_result")  # a tool env's
                    assert obs["tools"] == (local.tool_schemas() if info.get("tool_result") else [])
        finally:
            remote.close()
        meta = requests.get(f"{url}/metadata", timeout=WAIT_S).json()
        assert meta["name"] == env_id


VANISHING_CLIENT = """
import os, sys
from openenv.core import GenericEnvClient
env = GenericEnvClient(base_url=sys.argv[1]).sync().connect()
env.reset(seed=0)
print("played", flush=True)
os._exit(0)  # no close message, no closing handshake: the OS drops the socket
"""


@pytest.mark.slow  # a client process that imports openenv-core (seconds) and is killed
def test_sessions_are_isolated_bounded_and_closed_on_disconnect():
    with running(build_env_app("sokoban", max_sessions=2)) as url:
        first, second = client(url), client(url)
        a, b = make("sokoban"), make("sokoban")
        assert first.reset(seed=1).observation["text"] == a.reset(seed=1)[0]
        assert second.reset(seed=2).observation["text"] == b.reset(seed=2)[0]
        for move in ["Up", "Left", "Down", "Right"]:  # interleaved: two games, no crosstalk
            for remote, local in ((first, a), (second, b)):
                if not local.done:
                    assert remote.step({"action": move}).observation["text"] == local.step(move)[0]
        assert active_sessions(url) == 2
        third = client(url, connect=False)
        with pytest.raises(Exception):  # noqa: B017 - refused: at capacity
            third.connect()
            third.reset(seed=3)
        third.close()
        first.close()
        wait_until(lambda: active_sessions(url) == 1, "a closed session to end")
        second.close()
        wait_until(lambda: active_sessions(url) == 0, "both sessions to end")
        vanishing = subprocess.run(  # a client killed mid-game, without a goodbye
            [sys.executable, "-c", VANISHING_CLIENT, url], timeout=WAIT_S, capture_output=True
        )
        assert vanishing.returncode == 0 and b"played" in vanishing.stdout, vanishing.stderr
        wait_until(lambda: active_sessions(url) == 0, "a dropped session to end")
        fourth = client(url)  # the slots are free again
        assert fourth.reset(seed=1).observation["text"] == make("sokoban").reset(seed=1)[0]
        fourth.close()


@pytest.mark.slow  # openenv-core's reaper looks every 5 s at the soonest
def test_idle_sessions_are_reaped():
    with running(build_env_app("bandit", idle_timeout_s=0.5)) as url:
        idle = client(url)
        idle.reset(seed=0)
        assert active_sessions(url) == 1
        wait_until(lambda: active_sessions(url) == 0, "the idle session to be reaped")
        idle.close()


def test_serve_env_bad_input_is_one_line(capsys):
    assert main(["serve-env", "no-such-env"]) == 2
    assert "no-such-env" in capsys.readouterr().err
    assert main(["serve-env", "sokoban", "--idle-timeout", "-1"]) == 2
    assert "--idle-timeout" in capsys.readouterr().err
    assert main(["serve-env", "bandit", "--env-arg", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err


# ------------------------------------------------------ OpenEnv servers, consumed
def engine_for(tiny, max_turns: int) -> RolloutEngine:
    model, tokenizer = tiny
    settings = EpisodeSettings(
        think=False, max_turns=max_turns, max_new_tokens=10, temperature=0.0, top_p=1.0
    )
    return RolloutEngine(HFBackend(model, pad_token_id=tokenizer.pad_token_id), tokenizer, settings)


def comparable(trajectories) -> list[Any]:
    return [
        (
            t.seed,
            t.token_ids,
            t.loss_mask,
            [(turn.actions, turn.executed, turn.reward, turn.num_invalid) for turn in t.turns],
            t.success,
            t.done,
            t.error,
        )
        for t in trajectories
    ]


@pytest.mark.parametrize("env_id", ["sokoban", "countdown"])
def test_a_served_env_played_as_env_id_openenv_gives_the_same_episodes(tiny, env_id):
    """The round trip: same prompts, tokens, rewards and validity as the local env, and
    every session ends with its episode."""
    engine = engine_for(tiny, max_turns=3)
    local = engine.run(env_id, [0, 1, 2], 2)
    with running(build_env_app(env_id)) as url:
        remote = engine.run(
            env_id="openenv", seeds=[0, 1, 2], group_size=2, env_kwargs={"url": url}
        )
        assert active_sessions(url) == 0
    assert comparable(remote) == comparable(local)


@pytest.mark.parametrize("env_id", ["frozenlake", "sokoban"])
def test_a_served_env_judges_moves_through_env_id_openenv_as_the_local_one(env_id):
    """`action_is_optimal` crosses the wire: random moves (and an invalid answer, never
    judged) get the local env's verdicts, and both kinds occur, so the check can fail."""
    kwargs = {"is_slippery": False} if env_id == "frozenlake" else {}
    local = make(env_id, **kwargs)
    verdicts: list[Any] = []
    with running(build_env_app(env_id, kwargs)) as url:
        remote = make("openenv", url=url)
        try:
            for seed in range(6):
                local.reset(seed=seed)
                remote.reset(seed=seed)
                rng = np.random.default_rng(seed)
                while not local.done:
                    assert remote.good_actions() == local.good_actions()
                    answer = local.sample_action(rng) if len(verdicts) % 5 else "Jump"
                    *_, info = local.step(answer)
                    *_, remote_info = remote.step(answer)
                    assert remote_info.get("action_is_optimal") == info.get("action_is_optimal")
                    verdicts.append(info.get("action_is_optimal"))
        finally:
            remote.close()
    assert {True, False, None} <= set(verdicts)


def test_a_served_tool_env_played_as_env_id_openenv_takes_calls_as_the_local_one():
    """Gold calls, a malformed call and a reply without one, played locally and through the
    server: the same tool turns, results and outcome."""
    from scripted_backend import ScriptedBackend
    from starpo.models import load_tokenizer

    tokenizer = load_tokenizer()
    gold = {}
    for seed in (4, 5):
        env = make("invoice")
        env.reset(seed=seed)
        gold[seed] = []
        while not env.done:
            gold[seed].append(env.optimal_action())
            env.step(gold[seed][-1])

    def script(session: int, turn: int) -> str:
        calls = gold[4 + session]
        if turn == 1:
            return " x </think><tool_call>{oops</tool_call><|im_end|>"
        if turn == 2:
            return " x </think> no call<|im_end|>"
        return f" x </think><tool_call>{calls[turn - 3]}</tool_call><|im_end|>"

    settings = EpisodeSettings(max_turns=9, max_actions_per_traj=10, max_new_tokens=200)

    def play(env_id, **kwargs):
        engine = RolloutEngine(ScriptedBackend(tokenizer, script), tokenizer, settings)
        return engine.run(env_id, [4, 5], 1, env_kwargs=kwargs)

    local = play("invoice")
    with running(build_env_app("invoice")) as url:
        remote = play("openenv", url=url)
        assert active_sessions(url) == 0
    for a, b in zip(local, remote, strict=True):
        assert a.success and b.success and b.error is None
        assert [m["role"] for m in a.messages] == [m["role"] for m in b.messages]
        assert [t.tool_results for t in a.turns] == [t.tool_results for t in b.turns]
        assert a.messages == b.messages  # the same tools in the system message, same results
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert [t.num_invalid for t in b.turns][:2] == [1, 0]  # the malformed call, no call


def test_a_dead_server_is_an_env_fault_not_a_hang(tiny):
    engine = engine_for(tiny, max_turns=2)
    started = time.monotonic()
    nobody = f"http://127.0.0.1:{free_port()}"
    trajectories = engine.run("openenv", [0, 1], 1, env_kwargs={"url": nobody})
    assert all("Failed to connect" in t.error for t in trajectories)
    assert time.monotonic() - started < WAIT_S
    with running(build_env_app("sokoban")) as url:
        env = make("openenv", url=url)
        env.reset(seed=0)
    with pytest.raises(RuntimeError, match=f"OpenEnv server {url}"):
        env.step("Up")  # the server went away mid-episode


def test_bad_openenv_arguments_are_one_line():
    from starpo.errors import UserError

    with pytest.raises(UserError, match="needs url: e.g. --env-arg url=http://"):
        make("openenv")
    with pytest.raises(UserError, match="url must be the server's address"):
        make("openenv", url="localhost:8001")
    with pytest.raises(UserError, match="actions must be a list"):
        make("openenv", url="http://127.0.0.1:1", actions="Up")
    with pytest.raises(UserError, match="message_timeout_s must be a positive number"):
        make("openenv", url="http://127.0.0.1:1", message_timeout_s=0)


def test_cli_checks_and_evaluates_a_served_env_through_env_id_openenv(tmp_path, capsys):
    with running(build_env_app("frozenlake")) as url:
        assert main(["check-env", "openenv", "--env-arg", f"url={url}"]) == 0
        out = tmp_path / "eval"
        args = ["eval", "--env", "openenv", "--env-arg", f"url={url}", "--policy", "random"]
        assert main([*args, "--episodes", "4", "--out", str(out), "--quiet"]) == 0
        assert active_sessions(url) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_episodes"] == 4 and summary["valid_action_rate"] == 1.0
