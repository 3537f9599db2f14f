"""2048 as a text env: slide the tiles of a square board and merge equal ones.

Standard rules: a move (Up, Down, Left, Right) slides every tile as far as it goes; two equal
tiles that meet merge into their sum, each tile at most once a move. After every move that
changes the board a new tile appears on a random empty cell (2 with probability 0.9, else 4),
drawn from the env's generator, so a seed replays the same game. A move that changes nothing
is a valid action that uses budget but spawns nothing (`action_is_effective=False`).

Episodes end on success (a tile of value `target`), on game over (no move changes the board)
or when `max_steps` moves are spent. Reward of a move: the value of the tiles it merged,
divided by `target` (2048's score, scaled so that the rewards stay small), plus 1 on the move
that makes the target tile; a move that merges nothing earns 0.

Defaults (4x4, target 256, 250 moves) suit small models: every move adds a 2 or a 4 (2.2 on
average) and the other tiles add up to about 100 when 256 appears, so 256 takes about 160
moves: the heuristic solver takes 162 on average and at most 209 over seeds 0-99, and the
budget leaves slack for wasted moves. The random policy makes 256 in 8 of those 100 games (it
mostly runs out of room first): success is rare but not out of reach. 512 would take 230+
moves. `2048-3x3` (target 64, 80 moves) is the short version: about 40 moves. Either is far
longer than the default rollout (5 turns of at most 5 actions = 25 moves): raise
rollout.max_turns (and max_actions_per_turn) to give an episode its whole budget.

    >>> env = Game2048Env(size=2, target=32, max_steps=10)
    >>> print(env.reset(seed=0, options={"board": [[2, 2], [0, 4]]})[0])
    2 2
    . 4
    Score: 0
    >>> env.step("Left")[1]  # merged 2+2: 4 / 32
    0.125
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from starpo.envs.base import TextEnv
from starpo.envs.game2048.solver import (
    ACTIONS,
    Board,
    best_move,
    can_move,
    empty_cells,
    estimate_success,
    max_exponent,
    merged_tiles,
    move,
    new_board,
    spawn,
)
from starpo.errors import UserError

#: Extra reward on the move that makes the target tile.
SUCCESS_BONUS = 1.0
#: Playouts behind `optimal_success_probability` (each up to one heuristic game, ~0.1 s).
SUCCESS_PLAYOUTS = 8
MAX_SIZE = 8  # an 8x8 board is already ~200 prompt tokens


class Game2048Env(TextEnv):
    """2048 on a `size` x `size` board; success = a tile of value `target`.

    Args:
        size: side of the board (2 to 8).
        target: the tile to make, a power of two from 8 to 2**(size*size + 1).
        max_steps: moves allowed (ineffective ones count too); must leave the target
            reachable: tiles add up to at most 8 + 4 per move.
    """

    description: ClassVar[str] = "2048: slide and merge tiles to build the target tile."
    action_names = ACTIONS
    legend = {".": "empty cell"}

    def __init__(self, size: int = 4, target: int = 256, max_steps: int = 250) -> None:
        _check_args(size, target, max_steps)
        super().__init__(max_steps)
        self.size = int(size)
        self.target = int(target)
        self.target_exponent = self.target.bit_length() - 1
        # Before the target exists every tile is at most target/2, so a move merges at most
        # size//2 pairs a line into tiles of at most `target` each.
        self.reward_range = (0.0, float(self.size * (self.size // 2)) + SUCCESS_BONUS)
        self.instruction = _instruction(self.size, self.target)
        self.board: Board = ()
        self.score = 0
        self._best: tuple[Board, str | None] | None = None  # optimal_action's cache

    # ---------------------------------------------------------------- TextEnv hooks
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        board = options.pop("board", None)
        if options:
            raise UserError(f"unknown reset options {sorted(options)}; 2048 accepts: board")
        self.board = (
            new_board(self.size, self.np_random) if board is None else self._parse_board(board)
        )
        self.score = 0
        return {"max_tile": self.max_tile}

    def _step(self, action_index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        moved, points = move(self.board, action_index)
        effective = moved != self.board
        if effective:  # only a move that changes the board spawns a tile
            self.board = spawn(moved, self.np_random)
            self.score += points
        success = self.is_success()
        reward = points / self.target + (SUCCESS_BONUS if success else 0.0)
        terminated = success or not can_move(self.board)
        return reward, terminated, effective, {"points": points, "max_tile": self.max_tile}

    def render(self) -> str:
        """Rows of right-aligned tile values ('.' for empty), then the score."""
        width = len(str(self.max_tile))
        rows = [
            " ".join((str(1 << e) if e else ".").rjust(width) for e in row) for row in self.board
        ]
        return "\n".join([*rows, f"Score: {self.score}"])

    def snapshot(self) -> tuple[Board, int]:
        """The board (tile exponents, 0 = empty) and the score."""
        return self.board, self.score

    def state_key(self) -> tuple[int, ...]:
        """The tile values, row by row: equal boards are the same decision whatever the score
        (the render's score line would split them)."""
        return tuple((1 << e) if e else 0 for row in self.board for e in row)

    def is_success(self) -> bool:
        return bool(self.board) and max_exponent(self.board) >= self.target_exponent

    @property
    def max_tile(self) -> int:
        return 1 << max_exponent(self.board)

    # ---------------------------------------------------------------- solver hooks
    def optimal_action(self) -> str | None:
        """A HEURISTIC move, not an optimal one (optimal 2048 play is out of reach): one-ply
        expectimax over the next spawn (two plies on boards with at most 3 empty cells) with
        nneonneo's board heuristic; see `game2048_solver`. About 0.5 ms a move on 4x4. Over
        seeds 0-199 with the defaults it makes 256 in every game. None when the episode is over."""
        if self.done:
            return None
        if self._best is None or self._best[0] != self.board:
            direction = best_move(self.board)
            self._best = (self.board, None if direction is None else ACTIONS[direction])
        return self._best[1]

    def optimal_success_probability(self) -> float:
        """An ESTIMATE of the heuristic's success probability from here with the moves left:
        the fraction of SUCCESS_PLAYOUTS (8) heuristic games, with spawns from a generator
        seeded by the state, that make the target (exact 1 or 0 where that is certain). From
        a fresh 4x4 default board it costs about 0.5-1 s. Unbiased but coarse per state; the
        mean over an eval's episodes is what to read."""
        if self.done or self.is_success():
            return float(self.is_success())
        return estimate_success(self.board, self.steps_left, self.target_exponent, SUCCESS_PLAYOUTS)

    def explain(self, action: str) -> str | None:
        """What the solver's move does: the merges and points, the empty cells it leaves and
        whether the largest tile ends in a corner. None for any other action."""
        index = self.action_index(action)
        if index is None or ACTIONS[index] != self.optimal_action():
            return None
        moved, points = move(self.board, index)
        merged = merged_tiles(self.board, index)
        empty = len(empty_cells(moved))
        if merged:
            what = f"merges {_pairs(merged)} (+{points} points)"
        else:
            what = "merges nothing"
        cells = "cell" if empty == 1 else "cells"
        text = f"{ACTIONS[index]} {what} and leaves {empty} empty {cells}."
        top = max_exponent(moved)
        last = self.size - 1
        if any(moved[r][c] == top for r in (0, last) for c in (0, last)):
            text += f" My largest tile ({1 << top}) is in a corner after it."
        return text + " Looking ahead over the new tile, it rates best."

    # ------------------------------------------------------------------- helpers
    def _parse_board(self, rows: Any) -> Board:
        """A board from reset(options={"board": [[2, 0, ...], ...]}): tile values, 0 = empty."""
        hint = (
            f"pass {self.size} rows of {self.size} tile values (0 = empty), e.g. [[2, 0], [0, 4]]"
        )
        if not isinstance(rows, (list, tuple)) or len(rows) != self.size:
            raise UserError(f"board must have {self.size} rows, got {rows!r:.80}; {hint}")
        board = []
        for row in rows:
            if not isinstance(row, (list, tuple)) or len(row) != self.size:
                raise UserError(f"board rows must have {self.size} cells, got {row!r:.80}; {hint}")
            board.append(tuple(_exponent(value, self.target) for value in row))
        parsed = tuple(board)
        if not can_move(parsed):
            raise UserError("board has no move left (game over); give one with a move")
        return parsed

    def __repr__(self) -> str:
        return f"<Game2048Env size={self.size} target={self.target} max_steps={self.max_steps}>"


def _exponent(value: Any, target: int) -> int:
    """A reset board's tile value as an exponent (0 for an empty cell)."""
    if _is_int(value) and value == 0:
        return 0
    if not _is_int(value) or value < 2 or value & (value - 1) or value >= target:
        raise UserError(
            f"board tiles must be 0 (empty) or powers of two from 2 below the target {target}, "
            f"got {value!r:.40}"
        )
    return int(value).bit_length() - 1


def _pairs(merged: list[int]) -> str:
    """E.g. [16, 4, 4] -> "8+8 and two 2+2" (largest first)."""
    counts = {v: merged.count(v) for v in sorted(set(merged), reverse=True)}
    words = {2: "two ", 3: "three ", 4: "four "}
    parts = [
        f"{words.get(k, f'{k}x ') if k > 1 else ''}{v // 2}+{v // 2}" for v, k in counts.items()
    ]
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_args(size: Any, target: Any, max_steps: Any) -> None:
    """Constructor checks, each a one-line UserError naming the argument and the fix."""
    if not _is_int(size) or not 2 <= size <= MAX_SIZE:
        raise UserError(f"size must be an integer from 2 to {MAX_SIZE}, got {size!r}; e.g. size=4")
    highest = 1 << (size * size + 1)  # a full board of distinct tiles, all merged up
    if not _is_int(target) or target < 8 or target & (target - 1) or target > highest:
        raise UserError(
            f"target must be a power of two from 8 to {highest} on a {size}x{size} board, "
            f"got {target!r}; e.g. target=256"
        )
    if not _is_int(max_steps) or max_steps < 1:
        raise UserError(f"max_steps must be a positive integer, got {max_steps!r}")
    fewest = -(-(target - 8) // 4)  # tiles add up to at most 8 + 4 a move
    if max_steps < fewest:
        raise UserError(
            f"max_steps={max_steps} cannot reach the target {target}: it takes at least "
            f"{fewest} moves; raise max_steps (e.g. {max(fewest * 2, 250)}) or lower target"
        )


def _instruction(size: int, target: int) -> str:
    return (
        f"You are playing 2048 on a {size}x{size} board. A move (Up, Down, Left, Right) "
        "slides every tile as far as it goes that way; two equal tiles that meet merge into "
        "one with their sum (each tile merges once per move), which adds the sum to your "
        "score. After every move that changes the board a new 2 (sometimes a 4) appears on a "
        f"random empty cell; a move that changes nothing wastes an action. Goal: make a "
        f"{target} tile. The game ends when no move changes the board. Tip: keep your "
        "largest tile in a corner and keep cells empty."
    )
