"""Sudoku grids: random full grids, puzzles with a unique solution, a solution counter, and
the human-style deductions (naked and hidden singles) the env's solver and rationales use.

A grid is a flat list (or tuple) of `size * size` ints in row-major order, 0 for a blank;
digits are 1..size and boxes are sqrt(size) x sqrt(size). Candidate sets are bitmasks: bit
d-1 stands for digit d.

    >>> import numpy as np
    >>> puzzle, solution = make_puzzle(np.random.default_rng(0), 4, num_blanks=6)
    >>> puzzle.count(0), count_solutions(puzzle, 4), 0 in solution
    (6, 1, False)
"""

from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple

import numpy as np

from starpo.errors import UserError

#: Grid sizes the env supports: 4x4 (2x2 boxes) and 9x9 (3x3 boxes). 16x16 would need a
#: much faster solver to guarantee unique solutions, and its grid is a long prompt.
SIZES = (4, 9)
#: Most blanks a generated puzzle may have, per size. 4x4 puzzles need at least 4 givens
#: (greedy removal reaches 12 blanks in 1.4 grids on average, at most 6 in 300 seeds); 9x9
#: ones need 17, but greedy removal slows past ~55 blanks (55: 1.1 grids, 22 ms; 58: 3.7
#: grids, 190 ms).
MAX_BLANKS = {4: 12, 9: 55}
#: New full grids tried before generation gives up (only reachable near MAX_BLANKS).
MAX_GRID_TRIES = 200


class Geometry(NamedTuple):
    """Where each cell lies: its row, column and box index, and the cells of every unit."""

    size: int
    box: int
    rcb: tuple[tuple[int, int, int], ...]  # cell -> (row, column, box)
    rows: tuple[tuple[int, ...], ...]
    cols: tuple[tuple[int, ...], ...]
    boxes: tuple[tuple[int, ...], ...]


@cache
def geometry(size: int) -> Geometry:
    """The (cached) cell/unit layout of a `size` x `size` grid."""
    box = math.isqrt(size)
    rcb = tuple((r, c, r // box * box + c // box) for r in range(size) for c in range(size))
    rows = tuple(tuple(r * size + c for c in range(size)) for r in range(size))
    cols = tuple(tuple(r * size + c for r in range(size)) for c in range(size))
    boxes = tuple(tuple(i for i in range(size * size) if rcb[i][2] == b) for b in range(size))
    return Geometry(size, box, rcb, rows, cols, boxes)


def digits_of(mask: int) -> list[int]:
    """The digits in a candidate bitmask, ascending."""
    return [d + 1 for d in range(mask.bit_length()) if mask >> d & 1]


def _unit_masks(grid: list[int], geo: Geometry) -> tuple[list[int], list[int], list[int]]:
    """Bitmasks of the digits each row, column and box holds."""
    rows, cols, boxes = [0] * geo.size, [0] * geo.size, [0] * geo.size
    for i, value in enumerate(grid):
        if value:
            r, c, b = geo.rcb[i]
            bit = 1 << (value - 1)
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    return rows, cols, boxes


def is_consistent(grid: list[int] | tuple[int, ...], size: int) -> bool:
    """Whether no row, column or box holds a digit twice."""
    geo = geometry(size)
    for unit in geo.rows + geo.cols + geo.boxes:
        values = [grid[i] for i in unit if grid[i]]
        if len(values) != len(set(values)):
            return False
    return True


def candidates(grid: list[int] | tuple[int, ...], size: int, cell: int) -> int:
    """Bitmask of the digits that fit the blank `cell` (none in its row, column or box)."""
    geo = geometry(size)
    r, c, b = geo.rcb[cell]
    seen = 0
    for unit in (geo.rows[r], geo.cols[c], geo.boxes[b]):
        for i in unit:
            if grid[i]:
                seen |= 1 << (grid[i] - 1)
    return ((1 << size) - 1) & ~seen


def _search(
    cells: list[int],
    masks: tuple[list[int], list[int], list[int]],
    geo: Geometry,
    limit: int,
    rng: np.random.Generator | None,
    found: list[list[int]],
) -> int:
    """Count completions of `cells` (up to `limit`) by backtracking on the blank with the
    fewest candidates; the first completion is appended to `found`. With `rng`, digits are
    tried in random order (random full grids); without, in ascending order."""
    rows, cols, boxes = masks
    full = (1 << geo.size) - 1
    best, best_mask, best_count = -1, 0, geo.size + 1
    for i, value in enumerate(cells):
        if value:
            continue
        r, c, b = geo.rcb[i]
        mask = full & ~(rows[r] | cols[c] | boxes[b])
        count = mask.bit_count()
        if count < best_count:
            best, best_mask, best_count = i, mask, count
            if count <= 1:
                break
    if best < 0:
        if not found:
            found.append(cells.copy())
        return 1
    if best_count == 0:
        return 0
    values = digits_of(best_mask)
    if rng is not None and len(values) > 1:
        values = [values[k] for k in rng.permutation(len(values))]
    r, c, b = geo.rcb[best]
    total = 0
    for value in values:
        bit = 1 << (value - 1)
        cells[best] = value
        rows[r] |= bit
        cols[c] |= bit
        boxes[b] |= bit
        total += _search(cells, masks, geo, limit - total, rng, found)
        rows[r] &= ~bit
        cols[c] &= ~bit
        boxes[b] &= ~bit
        cells[best] = 0
        if total >= limit:
            break
    return total


def count_solutions(grid: list[int] | tuple[int, ...], size: int, limit: int = 2) -> int:
    """Number of completions of `grid`, counted up to `limit` (0 for an inconsistent one)."""
    if not is_consistent(grid, size):
        return 0
    geo = geometry(size)
    cells = list(grid)
    return _search(cells, _unit_masks(cells, geo), geo, limit, None, [])


def solve(grid: list[int] | tuple[int, ...], size: int) -> list[int] | None:
    """One completion of `grid` (the smallest in digit order), or None when there is none."""
    if not is_consistent(grid, size):
        return None
    geo = geometry(size)
    cells, found = list(grid), []
    _search(cells, _unit_masks(cells, geo), geo, 1, None, found)
    return found[0] if found else None


def random_full_grid(rng: np.random.Generator, size: int) -> list[int]:
    """A random complete grid: backtracking from an empty grid, digits in random order."""
    geo = geometry(size)
    cells, found = [0] * (size * size), []
    _search(cells, _unit_masks(cells, geo), geo, 1, rng, found)
    return found[0]


def _still_unique(puzzle: list[int], size: int, cell: int, value: int) -> bool:
    """Whether `puzzle` (unique so far) stays unique with `cell` (holding `value`) blanked:
    no other digit that fits the cell completes the grid."""
    puzzle[cell] = 0
    others = candidates(puzzle, size, cell) & ~(1 << (value - 1))
    unique = True
    for other in digits_of(others):  # none: the cell is a naked single, no search needed
        puzzle[cell] = other
        if count_solutions(puzzle, size, limit=1):
            unique = False
            break
    puzzle[cell] = value
    return unique


def make_puzzle(
    rng: np.random.Generator, size: int, num_blanks: int, max_tries: int = MAX_GRID_TRIES
) -> tuple[list[int], list[int]]:
    """(puzzle, solution): a random full grid with `num_blanks` cells blanked, one at a time
    in random order, skipping any whose blanking would allow a second solution. A grid
    that cannot lose enough cells this way is replaced by a new one."""
    for _ in range(max_tries):
        solution = random_full_grid(rng, size)
        puzzle = solution.copy()
        blanks = 0
        for cell in rng.permutation(size * size).tolist():
            if blanks == num_blanks:
                break
            if _still_unique(puzzle, size, cell, solution[cell]):
                puzzle[cell] = 0
                blanks += 1
        if blanks == num_blanks:
            return puzzle, solution
    raise UserError(
        f"no {size}x{size} puzzle with {num_blanks} blanks and a unique solution found in "
        f"{max_tries} tries; use fewer blanks (at most {MAX_BLANKS.get(size, num_blanks)})"
    )


# ---------------------------------------------------------------------------- deductions
class Deduction(NamedTuple):
    """Why a blank holds its digit: "naked" (the only digit that fits the cell), "hidden"
    (the only cell of `unit` the digit fits) or "search" (other digits fit, but each one
    leaves the puzzle without a solution)."""

    cell: int
    value: int
    kind: str
    unit: str = ""  # "row", "column" or "box" for a hidden single


def _hidden_unit(grid: tuple[int, ...], size: int, cell: int, value: int) -> str:
    """The first unit of `cell` (row, column, box) where `value` fits no other blank."""
    geo = geometry(size)
    r, c, b = geo.rcb[cell]
    bit = 1 << (value - 1)
    for name, unit in (("row", geo.rows[r]), ("column", geo.cols[c]), ("box", geo.boxes[b])):
        if not any(i != cell and not grid[i] and candidates(grid, size, i) & bit for i in unit):
            return name
    return ""


def deduce(grid: tuple[int, ...], solution: tuple[int, ...], size: int, cell: int) -> Deduction:
    """How the blank `cell` of `grid` can be seen to hold its solution digit."""
    value = solution[cell]
    if candidates(grid, size, cell) == 1 << (value - 1):
        return Deduction(cell, value, "naked")
    unit = _hidden_unit(grid, size, cell, value)
    return Deduction(cell, value, "hidden", unit) if unit else Deduction(cell, value, "search")


def next_deduction(grid: tuple[int, ...], solution: tuple[int, ...], size: int) -> Deduction | None:
    """The easiest next placement, as a person solves: the first naked single (row-major),
    else the first hidden single, else the blank with the fewest candidates."""
    blanks = [i for i, value in enumerate(grid) if not value]
    if not blanks:
        return None
    counts = {i: candidates(grid, size, i).bit_count() for i in blanks}
    for i in blanks:
        if counts[i] == 1:
            return Deduction(i, solution[i], "naked")
    for i in blanks:
        unit = _hidden_unit(grid, size, i, solution[i])
        if unit:
            return Deduction(i, solution[i], "hidden", unit)
    cell = min(blanks, key=lambda i: (counts[i], i))
    return Deduction(cell, solution[cell], "search")
