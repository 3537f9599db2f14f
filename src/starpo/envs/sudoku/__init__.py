"""Sudoku: fill the grid. `env`: the env (`SudokuEnv`); `puzzles`."""

from starpo.envs.sudoku.env import SudokuEnv

__all__ = ["SudokuEnv"]
