"""2048 board logic and a heuristic expectimax player (pure functions, no env state).

A board is a tuple of rows, each a tuple of tile exponents: 0 is an empty cell, e stands for
the tile 2**e. Exponents keep rows small hashable keys, so a row's slide and its heuristic
score are computed once and cached (the same few thousand rows recur all game long).

Directions are indices into `ACTIONS`: 0 Up, 1 Down, 2 Left, 3 Right.

The player is a heuristic, not an optimal policy (optimal 2048 play is out of reach): a
one-ply expectimax (each move, then the average over every spawn: each empty cell, a 2 with
probability 0.9 or a 4 with 0.1) scored by nneonneo's row heuristic (empty cells, merge
potential, monotonicity, a penalty on large tiles); on cramped boards (few empty cells) it
looks one move and spawn further, which is cheap there and where it matters.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

ACTIONS = ("Up", "Down", "Left", "Right")
UP, DOWN, LEFT, RIGHT = range(4)
#: Probability that a spawned tile is a 4 (else a 2), as in the original game.
FOUR_PROBABILITY = 0.1

Row = tuple[int, ...]
Board = tuple[Row, ...]

# nneonneo/2048-ai's heuristic weights (tuned by its author for strong play).
_LOST_PENALTY = 200_000.0  # a constant per row, so every live board scores above a lost one
_MONOTONICITY_POWER = 4.0
_MONOTONICITY_WEIGHT = 47.0
_SUM_POWER = 3.5
_SUM_WEIGHT = 11.0
_MERGES_WEIGHT = 700.0
_EMPTY_WEIGHT = 270.0
#: Boards with at most this many empty cells get the deeper (two-ply) search.
DEEP_SEARCH_EMPTY = 3


# ----------------------------------------------------------------------- moves
@lru_cache(maxsize=1 << 16)
def slide_row(row: Row) -> tuple[Row, int]:
    """Slide `row` towards index 0, merging equal neighbours once each (the first pair wins,
    as in the game: 2 2 2 -> 4 2). Returns the new row and the merged tiles' total value."""
    new, merged = merge_row(row)
    return new, sum(1 << e for e in merged)


@lru_cache(maxsize=1 << 16)
def merge_row(row: Row) -> tuple[Row, Row]:
    """`slide_row`'s new row, and the exponents of the tiles its merges made."""
    tiles = [e for e in row if e]
    out: list[int] = []
    merged: list[int] = []
    i = 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            out.append(tiles[i] + 1)
            merged.append(tiles[i] + 1)
            i += 2
        else:
            out.append(tiles[i])
            i += 1
    return tuple(out + [0] * (len(row) - len(out))), tuple(merged)


def _slide_rows(rows: Board, reverse: bool) -> tuple[Board, int]:
    moved: list[Row] = []
    gained = 0
    for row in rows:
        new, points = slide_row(row[::-1] if reverse else row)
        moved.append(new[::-1] if reverse else new)
        gained += points
    return tuple(moved), gained


def merged_tiles(board: Board, direction: int) -> list[int]:
    """The values of the tiles that a move in `direction` makes by merging (for rationales)."""
    lines = board if direction in (LEFT, RIGHT) else transpose(board)
    reverse = direction in (RIGHT, DOWN)
    return [1 << e for line in lines for e in merge_row(line[::-1] if reverse else line)[1]]


def transpose(board: Board) -> Board:
    return tuple(zip(*board, strict=True))


def move(board: Board, direction: int) -> tuple[Board, int]:
    """The board after sliding every tile in `direction`, and the value of the merged tiles
    (the score it adds). The board is unchanged when no tile can move that way."""
    if direction in (LEFT, RIGHT):
        return _slide_rows(board, reverse=direction == RIGHT)
    columns, gained = _slide_rows(transpose(board), reverse=direction == DOWN)
    return transpose(columns), gained


def effective_moves(board: Board) -> list[tuple[int, Board, int]]:
    """(direction, new board, points) for every move that changes the board, in ACTIONS order."""
    out = []
    for direction in range(len(ACTIONS)):
        new, gained = move(board, direction)
        if new != board:
            out.append((direction, new, gained))
    return out


def can_move(board: Board) -> bool:
    """Whether any move changes the board (otherwise the game is over)."""
    return any(move(board, d)[0] != board for d in range(len(ACTIONS)))


def empty_cells(board: Board) -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(board) for c, e in enumerate(row) if not e]


def place(board: Board, cell: tuple[int, int], exponent: int) -> Board:
    r, c = cell
    row = board[r]
    return board[:r] + (row[:c] + (exponent,) + row[c + 1 :],) + board[r + 1 :]


def spawn(board: Board, rng: np.random.Generator) -> Board:
    """A new tile on a uniformly drawn empty cell: 2 with probability 0.9, else 4. Always two
    draws from `rng` (cell, then value), so equal seeds replay equal games."""
    cells = empty_cells(board)
    cell = cells[int(rng.integers(len(cells)))]
    exponent = 2 if rng.random() < FOUR_PROBABILITY else 1
    return place(board, cell, exponent)


def max_exponent(board: Board) -> int:
    return max(max(row) for row in board)


# ------------------------------------------------------------------- heuristic
@lru_cache(maxsize=1 << 16)
def row_score(row: Row) -> float:
    """nneonneo's per-row heuristic: rewards empty cells, equal neighbours and rows that rise
    or fall steadily; penalises the total of large tiles (they must be merged away)."""
    empty = sum(1 for e in row if not e)
    merges, prev, run = 0, 0, 0
    for e in row:
        if not e:
            continue
        if e == prev:
            run += 1
        elif run:
            merges += 1 + run
            run = 0
        prev = e
    if run:
        merges += 1 + run
    rising = falling = 0.0
    for a, b in zip(row, row[1:], strict=False):
        pa, pb = a**_MONOTONICITY_POWER, b**_MONOTONICITY_POWER
        if a > b:
            falling += pa - pb
        else:
            rising += pb - pa
    return (
        _LOST_PENALTY
        + _EMPTY_WEIGHT * empty
        + _MERGES_WEIGHT * merges
        - _MONOTONICITY_WEIGHT * min(rising, falling)
        - _SUM_WEIGHT * sum(e**_SUM_POWER for e in row)
    )


def board_score(board: Board) -> float:
    """The heuristic value of a board: the row score of every row and every column."""
    return sum(map(row_score, board)) + sum(map(row_score, zip(*board, strict=True)))


# ------------------------------------------------------------------ expectimax
def _chance_value(board: Board, depth: int) -> float:
    """Expected value over the spawn that follows a move (every empty cell, 2 or 4)."""
    if depth <= 1:
        return _leaf_chance_value(board)
    cells = empty_cells(board)
    total = 0.0
    for cell in cells:
        for exponent, p in ((1, 1.0 - FOUR_PROBABILITY), (2, FOUR_PROBABILITY)):
            total += p * _max_value(place(board, cell, exponent), depth - 1)
    return total / len(cells)


def _leaf_chance_value(board: Board) -> float:
    """`_chance_value` at depth 1, the hot loop: a spawn changes one row and one column, so
    only those two row scores are recomputed (same value as `board_score` of each child)."""
    columns = transpose(board)
    row_scores = [row_score(row) for row in board]
    column_scores = [row_score(col) for col in columns]
    base = sum(row_scores) + sum(column_scores)
    cells = empty_cells(board)
    total = 0.0
    for r, c in cells:
        row, col = board[r], columns[c]
        rest = base - row_scores[r] - column_scores[c]
        for exponent, p in ((1, 1.0 - FOUR_PROBABILITY), (2, FOUR_PROBABILITY)):
            new_row = row[:c] + (exponent,) + row[c + 1 :]
            new_col = col[:r] + (exponent,) + col[r + 1 :]
            total += p * (rest + row_score(new_row) + row_score(new_col))
    return total / len(cells)


def _max_value(board: Board, depth: int) -> float:
    moves = effective_moves(board)
    if not moves:
        return 0.0  # game over: below every live board (see _LOST_PENALTY)
    return max(_chance_value(new, depth) for _, new, _ in moves)


def best_move(board: Board) -> int | None:
    """The heuristic player's move (a direction), or None when no move changes the board.
    Ties go to the earlier action in ACTIONS, so the choice is deterministic."""
    moves = effective_moves(board)
    if not moves:
        return None
    depth = 2 if len(empty_cells(board)) <= DEEP_SEARCH_EMPTY else 1
    values = [_chance_value(new, depth) for _, new, _ in moves]
    return moves[values.index(max(values))][0]


def playout(board: Board, steps: int, target_exponent: int, rng: np.random.Generator) -> bool:
    """Play the heuristic for at most `steps` moves with spawns from `rng`; whether it made
    the target tile. Every move it plays changes the board, so each uses one step."""
    for _ in range(steps):
        if max_exponent(board) >= target_exponent:
            return True
        direction = best_move(board)
        if direction is None:
            return False
        board = spawn(move(board, direction)[0], rng)
    return max_exponent(board) >= target_exponent


def new_board(size: int, rng: np.random.Generator) -> Board:
    """An empty `size` x `size` board with two spawned tiles."""
    board: Board = tuple((0,) * size for _ in range(size))
    return spawn(spawn(board, rng), rng)


def tile_sum(board: Board) -> int:
    return sum(1 << e for row in board for e in row if e)


def estimate_success(board: Board, steps: int, target_exponent: int, playouts: int) -> float:
    """Monte-Carlo estimate of the heuristic's chance to make the target tile within `steps`
    moves: the fraction of `playouts` games that do, each with fresh random spawns.

    Unbiased, but coarse (steps of 1/playouts); averaged over many episodes it is accurate.
    The spawns come from a generator seeded by the state itself, so the same state always
    gets the same estimate and no env generator is touched. Exact shortcuts: 1 once the
    target is made; 0 when even a 4 spawned after every move cannot add up to the target
    (the tile sum grows by at most 4 a move, and a tile is never larger than the sum).
    """
    target = 1 << target_exponent
    if max_exponent(board) >= target_exponent:
        return 1.0
    if tile_sum(board) + 4 * steps < target:
        return 0.0
    digest = hashlib.blake2b(repr((board, steps, target_exponent)).encode(), digest_size=8)
    rng = np.random.default_rng(int.from_bytes(digest.digest(), "little"))
    wins = sum(playout(board, steps, target_exponent, rng) for _ in range(playouts))
    return wins / playouts
