"""Fixture folders for the viewer tests (written by hand, no training) and a headless browser."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from starpo.types import EnvStep, Episode, Trajectory, Turn

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def make_turn(state: str, response: str, actions: list[str], executed: list[str], reward: float):
    """A Turn with consistent counts (an action not executed counts as invalid)."""
    invalid = len(actions) - len(executed)
    return Turn(
        state=state,
        response=response,
        think=response.split("</think>")[0].removeprefix("<think>"),
        actions=actions,
        executed=executed,
        format_ok=True,
        env_reward=reward,
        reward=reward - 0.1 * invalid,
        format_penalty=-0.1 * invalid,
        num_valid=len(executed),
        num_effective=len(executed),
        num_invalid=invalid,
        response_tokens=12,
    )


def make_traj(env_id: str, seed: int, success: bool, n_turns: int, note: str = "") -> Trajectory:
    """A trajectory of `n_turns` turns on a tiny grid; `note` goes into the first response."""
    turns = [
        make_turn(
            state=f"#####\n#P.G#\n#####\nturn {k} seed {seed}",
            response=f"<think>go right {note if k == 0 else ''}</think>"
            "<answer>Right || Jump</answer>",
            actions=["Right", "Jump"],
            executed=["right"],
            reward=1.0 if (success and k == n_turns - 1) else 0.0,
        )
        for k in range(n_turns)
    ]
    return Trajectory(
        env_id=env_id,
        seed=seed,
        group=seed,
        messages=[{"role": "user", "content": "play"}],
        turns=turns,
        token_ids=list(range(50)),
        loss_mask=[1] * 50,
        logprobs=[-0.5] * 50,
        turn_ends=[50],
        success=success,
        done=success,
        final_state=f"#####\n#..P#\n#####\nend seed {seed}",
    )


def write_jsonl(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


# Hostile model text: each piece would run script or make an element if rendered as HTML.
HOSTILE = (
    '</script><script>window.__pwned=1</script> <img src=x onerror="window.__pwned=2"> '
    '<a href="javascript:window.__pwned=3">x</a> \u2028 & <!-- end'
)


@pytest.fixture
def hostile_text() -> str:
    return HOSTILE


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A training run: two train steps, one val step, metrics with nulls, one alert.

    The first episode of step 10 carries hostile text in its response, think and state.
    """
    root = tmp_path / "run"
    hostile = make_traj("bandit", 1, True, 1, note=HOSTILE)
    hostile.turns[0].state += "\n" + HOSTILE
    write_jsonl(
        root / "trajectories" / "step_000010.jsonl",
        [
            hostile.to_json(),
            make_traj("bandit", 2, False, 2).to_json(),
            make_traj("sokoban", 3, True, 3).to_json(),
        ],
    )
    write_jsonl(
        root / "trajectories" / "step_000020.jsonl",
        [make_traj("bandit", 1, False, 4).to_json(), make_traj("bandit", 2, True, 1).to_json()],
    )
    write_jsonl(
        root / "val_trajectories" / "step_000010.jsonl", [make_traj("bandit", 7, True, 1).to_json()]
    )
    rows = [
        {
            "step": s,
            "train/bandit/success": s / 20,
            "actor/entropy": 2.0 - s / 15,
            "actor/grad_norm": None if s % 3 else 1.0 + s,
            "rollout/in_group_std": 0.5,
            "other/thing": s,
        }
        for s in range(21)
    ]
    write_jsonl(root / "metrics.jsonl", [json.dumps(r) for r in rows])
    alert = {"step": 12, "state": "warning", "rule": "entropy_drop", "message": "entropy fell"}
    write_jsonl(root / "alerts.jsonl", [json.dumps(alert)])
    return root


@pytest.fixture
def windowed_run_dir(tmp_path: Path) -> Path:
    """A run whose one trajectory played with rollout.context_window=last_k, one turn kept:
    turn 3's prompt showed turns 2 and 3 only."""
    traj = make_traj("sokoban", 4, False, 3)
    for turn, start in zip(traj.turns, (1, 1, 2), strict=True):
        turn.window_start = start
    root = tmp_path / "windowed"
    write_jsonl(root / "trajectories" / "step_000001.jsonl", [traj.to_json()])
    return root


@pytest.fixture
def tool_run_dir(tmp_path: Path) -> Path:
    """A run whose one trajectory is a tool-calling env's: a result holding hostile text,
    then an invalid call's error."""
    traj = make_traj("invoice", 5, False, 1)
    traj.turns[0].tool_results = [f'{{"name": "{HOSTILE}"}}', "Error: unknown tool"]
    root = tmp_path / "tools"
    write_jsonl(root / "trajectories" / "step_000001.jsonl", [traj.to_json()])
    return root


@pytest.fixture
def eval_dir(tmp_path: Path) -> Path:
    """A `starpo eval` folder mixing a random-policy Episode and an LLM Trajectory."""
    root = tmp_path / "eval"
    episode = Episode(
        env_id="bandit",
        seed=5,
        policy="random",
        initial_observation="start",
        steps=[
            EnvStep("Pull", "nothing", 0.0, False, False, False, False),
            EnvStep("Left", "won", 1.0, True, False, True, True),
        ],
        success=True,
    )
    write_jsonl(
        root / "trajectories.jsonl", [episode.to_json(), make_traj("bandit", 6, False, 1).to_json()]
    )
    (root / "summary.json").write_text(json.dumps({"success_rate": 0.5, "episodes": 2}))
    return root


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session, driven by Selenium with the system driver."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs pip install selenium")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="starpo-chromium-")
    options = webdriver.ChromeOptions()
    # binary_location + an explicit Service path: Selenium Manager never downloads anything.
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(10)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
