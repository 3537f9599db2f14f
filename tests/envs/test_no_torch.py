"""envs/ must never import torch or a model: it runs in cheap env workers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import starpo.envs

ENVS_DIR = Path(starpo.envs.__file__).parent
FORBIDDEN = {"torch", "transformers", "peft", "starpo.models", "starpo.rollout", "starpo.trainer"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_envs_module_imports_torch_or_models():
    for path in ENVS_DIR.glob("*.py"):
        bad = {
            m
            for m in imported_modules(path)
            if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
        }
        assert not bad, f"{path.name} imports {bad}"


def test_using_every_env_loads_no_torch():
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from starpo.envs import make, standalone_ids, check_env\n"
        "for env_id in standalone_ids():\n"
        "    env = make(env_id); env.reset(seed=1)\n"
        "    env.step(env.sample_action(np.random.default_rng(0)))\n"
        "    env.optimal_action() if hasattr(env, 'optimal_action') else None\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('clean')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "clean" in result.stdout
