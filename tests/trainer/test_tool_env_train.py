"""Training on a tool-calling env end to end: the memory plan, rollouts with the tools in
the system message, the update and the logged metrics, with a tiny random policy."""

from __future__ import annotations

import json

from starpo.config import load_config
from starpo.trainer.loop import Trainer


def test_two_steps_on_a_tool_env_train_and_log(tmp_path, tiny_model_dir):
    cfg = load_config(
        "cpu-tiny-smoke",
        [
            f"model.name={tiny_model_dir}",
            "env.id=invoice",
            "rollout.max_turns=2",
            "rollout.max_actions_per_traj=2",
            "rollout.max_new_tokens=8",
            "algorithm.adv_estimator=grpo",
        ],
    )
    history = Trainer(cfg, tmp_path / "run", quiet=True).train()
    assert [row["step"] for row in history] == [1, 2]
    assert all(row["train/invoice/num_episodes"] == 4 for row in history)
    (logged,) = (tmp_path / "run" / "trajectories").glob("step_000002.jsonl")
    traj = json.loads(logged.read_text().splitlines()[0])
    system = traj["messages"][0]
    assert system["role"] == "system" and '"name": "record_decision"' in system["content"]
    # The random policy makes no call: its second turn is told so, with the format.
    assert "made no tool call" in traj["messages"][3]["content"]
