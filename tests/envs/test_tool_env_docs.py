"""The tool env written out in docs/tool-agents.md is a working env: the page's code runs,
keeps the env contract and scores a gold episode 1."""

from __future__ import annotations

import re
from pathlib import Path

from starpo.envs.checker import check_env
from starpo.envs.registry import ENVS
from starpo.envs.tools import call_text

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tool-agents.md"


def test_the_pages_tool_env_keeps_the_contract_and_scores_the_gold_state():
    (code,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    namespace: dict = {}
    try:
        exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - our own docs
        env = namespace["LedgerEnv"]()
        check_env(env)
        env.reset(seed=3)
        move = {"source": "A", "target": "B", "amount": env.amount}
        for call in (call_text("transfer", move), call_text("submit", {})):
            _, reward, terminated, _, info = env.step(call)
        assert terminated and reward == 1.0 and info["success"]
    finally:
        ENVS.unregister("ledger")  # the page registers it: leave the registry as it was
