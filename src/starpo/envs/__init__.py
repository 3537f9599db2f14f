"""Text environments for multi-turn agents (no torch, no model imports here).

>>> from starpo.envs import make
>>> env = make("sokoban")
>>> obs, info = env.reset(seed=10000)
>>> obs, reward, terminated, truncated, info = env.step("Up")
"""

from __future__ import annotations

from starpo.envs.base import TextEnv
from starpo.envs.checker import check_env
from starpo.envs.registry import (
    EnvSpec,
    make,
    register,
    registered_ids,
    spec,
    standalone_ids,
)

__all__ = [
    "EnvSpec",
    "TextEnv",
    "check_env",
    "make",
    "register",
    "registered_ids",
    "spec",
    "standalone_ids",
]

# Built-in ids (constructors are imported lazily, on first `make`).
register(
    "bandit",
    "starpo.envs.bandit:BanditEnv",
    description="Two-armed bandit: Dragon (risky, high EV) vs Phoenix (safe); 1 turn.",
)
register(
    "bandit-rev",
    "starpo.envs.bandit:BanditEnv",
    kwargs={"low_risk_name": "Trader", "high_risk_name": "Librarian"},
    description="Two-armed bandit with other arm names: Librarian (risky, high EV) vs Trader.",
)
register(
    "frozenlake",
    "starpo.envs.frozenlake.env:FrozenLakeEnv",
    description="Slippery FrozenLake on random 4x4 maps with a guaranteed path.",
)
register(
    "sokoban",
    "starpo.envs.sokoban.env:SokobanEnv",
    kwargs={"dim_room": (6, 6), "num_boxes": 1},
    description="Sokoban 6x6 with 1 box, solvable within the action budget.",
)
register(
    "sokoban-coord",
    "starpo.envs.sokoban.env:SokobanEnv",
    kwargs={"dim_room": (6, 6), "num_boxes": 1, "coordinates": True},
    description="Sokoban 6x6 with 1 box, the grid plus player, box and target coordinates "
    "(RAGEN-2's CoordSokoban).",
)
register(
    "frozenlake-coord",
    "starpo.envs.frozenlake.env:FrozenLakeEnv",
    kwargs={"is_slippery": False, "coordinates": True},
    description="FrozenLake 4x4 on dry ice, the map plus player, goal and hole coordinates.",
)
register(
    "sokoban-large",
    "starpo.envs.sokoban.env:SokobanEnv",
    kwargs={"dim_room": (8, 8), "num_boxes": 2},
    description="Sokoban 8x8 with 2 boxes, solvable within the action budget.",
)
register(
    "sokoban-newvocab",
    "starpo.envs.sokoban.env:SokobanEnv",
    kwargs={"dim_room": (6, 6), "num_boxes": 1, "vocab": "newvocab"},
    description="Sokoban 6x6 with 1 box drawn with other symbols (W . G C B A @).",
)
register(
    "qa",
    "starpo.envs.qa.env:QAEnv",
    description="Question answering: a JSONL file of questions and answers (env.kwargs.path, "
    "e.g. GSM8K), numeric or exact answers; without a file, generated arithmetic.",
)
register(
    "sudoku",
    "starpo.envs.sudoku.env:SudokuEnv",
    description="Sudoku 4x4 with 6 blanks and a unique solution; one placement (r2c3=4) a turn.",
)
register(
    "sudoku-9x9",
    "starpo.envs.sudoku.env:SudokuEnv",
    kwargs={"size": 9, "num_blanks": 30},
    description="Sudoku 9x9 with 30 blanks and a unique solution; one placement (r2c3=4) a turn.",
)
register(
    "countdown",
    "starpo.envs.countdown.env:CountdownEnv",
    description="Countdown: reach the target with + - * / using each of 3-4 numbers once; "
    "one answer.",
)
register(
    "countdown-multi",
    "starpo.envs.countdown.env:CountdownEnv",
    kwargs={"attempts": 4},
    description="Countdown with 4 attempts: a wrong answer is told why (value, numbers used).",
)
register(
    "2048",
    "starpo.envs.game2048.env:Game2048Env",
    description="2048 on a 4x4 board: merge tiles up to 256 within 250 moves (long horizon).",
)
register(
    "2048-3x3",
    "starpo.envs.game2048.env:Game2048Env",
    kwargs={"size": 3, "target": 64, "max_steps": 80},
    description="2048 on a 3x3 board: merge tiles up to 64 within 80 moves.",
)
register(
    "invoice",
    "starpo.envs.invoice.env:InvoiceEnv",
    description="Accounts payable: process an incoming invoice against the company's vendors, "
    "purchase orders and receipts with tool calls; scored by the final database state.",
)
register(
    "support",
    "starpo.envs.support.env:SupportEnv",
    description="Customer support: resolve a customer's request within the written policy "
    "with tool calls and a scripted customer; scored by the final database state.",
)
register(
    "openenv",
    "starpo.envs.openenv_remote:OpenEnvEnv",
    description="An OpenEnv environment server, one session per episode "
    "(env.kwargs.url=http://HOST:PORT; needs starpo[openenv]).",
    requires={"url": "http://127.0.0.1:8001"},
)
