"""experiments/frozenlake_moves.py: the solver's moves are all good, a policy that ignores
the map scores what random moves would, and the parser reads every rendering."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

from starpo.envs.frozenlake.env import FrozenLakeEnv

_SPEC = importlib.util.spec_from_file_location(
    "frozenlake_moves", Path(__file__).parents[1] / "experiments" / "frozenlake_moves.py"
)
frozenlake_moves = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(frozenlake_moves)


def _episodes(choose, seeds=range(40), **kwargs) -> list[dict]:
    """Non-slippery episodes as a rollout saves them (each turn's state and actions),
    `choose(env)` naming each move."""
    env = FrozenLakeEnv(is_slippery=False, **kwargs)
    episodes = []
    for seed in seeds:
        env.reset(seed=seed)
        turns, done = [], False
        while not done:
            state, action = env.render(), choose(env)
            turns.append({"state": state, "actions": [action]})
            _, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
        episodes.append({"turns": turns})
    return episodes


def test_the_solvers_moves_are_all_good_and_a_fixed_move_is_at_random_level():
    solver = frozenlake_moves.move_quality(_episodes(lambda env: env.optimal_action()))
    assert solver["turns"] > 40 and solver["good"] == 1.0
    assert 0.25 <= solver["random"] <= 0.6  # one or two of four moves lead closer
    # A policy blind to the map: uniform moves score what random moves would; always
    # the same move scores less (it ends up pressed against a wall, every turn wasted).
    blind = frozenlake_moves.move_quality(_episodes(lambda env: "Down", seeds=range(200)))
    assert blind["good"] < blind["random"] - 0.1
    rng = random.Random(0)
    uniform = frozenlake_moves.move_quality(
        _episodes(lambda env: rng.choice(["Left", "Down", "Right", "Up"]), seeds=range(200))
    )
    assert abs(uniform["good"] - uniform["random"]) < 0.06


def test_the_parser_reads_spaced_cells_and_coordinates_and_skips_ended_episodes():
    plain = frozenlake_moves.parse_map("P__O\nO_OO\n__G_\n__O_")
    assert plain == (("FFFH", "HFHH", "FFGF", "FFHF"), (0, 0))
    env = FrozenLakeEnv(is_slippery=False, cell_sep=" ", coordinates=True)
    env.reset(seed=3)
    rows, player = frozenlake_moves.parse_map(env.render())
    assert player == tuple(env.position) and rows[player[0]][player[1]] == "F"
    assert frozenlake_moves.parse_map("__X_\nG___\n____\n____") is None  # in a hole: over
    assert frozenlake_moves.parse_map("Reward: 1") is None


def test_good_moves_go_round_holes_and_off_grid_moves_never_count():
    rows = ("FFFF", "FHHF", "FFGF", "FFFF")
    assert frozenlake_moves.good_actions(rows, (0, 1)) == {"Left", "Right"}  # H below
    assert frozenlake_moves.good_actions(rows, (2, 3)) == {"Left"}
    assert frozenlake_moves.good_actions(("FH", "HG"), (0, 0)) == set()  # walled off


def test_the_command_prints_a_row_per_step_and_refuses_a_folder_without_steps(tmp_path, capsys):
    folder = tmp_path / "val_trajectories"
    folder.mkdir()
    episodes = _episodes(lambda env: env.optimal_action(), seeds=range(5))
    for step in (0, 10):
        lines = "".join(json.dumps(e) + "\n" for e in episodes)
        (folder / f"step_{step:06d}.jsonl").write_text(lines)
    assert frozenlake_moves.main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and printed[2].split()[0] == "10" and "100.0%" in printed[2]
    assert frozenlake_moves.main([str(tmp_path), "--train"]) == 2
    assert "no step_*.jsonl" in capsys.readouterr().err
