"""Sudoku as a free-text env: fill a 4x4 (or 9x9) grid, one placement per action.

Each answer places one digit, e.g. `r2c3=4` (row 2, column 3, digit 4; 1-based). The
grammar is small and case-insensitive, with spaces allowed between its parts:
`r<row>c<column>=<digit>` (also `r2 c3 = 4`, `r2,c3=4`) or `(<row>,<column>)=<digit>`.
Anything else, a row, column or digit out of range, or a cell that is already filled (a
given or an earlier placement: cells cannot be overwritten) is an invalid action that
changes nothing.

A placement that matches the (unique) solution fills the cell and earns +0.1; filling the
last blank earns +1 more and ends the episode, solved. A wrong placement earns -0.1, is
rejected (the cell stays empty, the observation says why), and uses one action of the
budget, which is the number of blanks plus a few actions of slack for mistakes.

Levels come from the seed: a random full grid (backtracking with digits in random order),
then cells blanked in random order as long as the solution stays unique.

    >>> env = SudokuEnv()
    >>> obs, info = env.reset(options={"puzzle": "1.34 3412 2143 4321"})
    >>> print(obs)
        1 2   3 4
    r1  1 . | 3 4
    r2  3 4 | 1 2
        ----+----
    r3  2 1 | 4 3
    r4  4 3 | 2 1
    >>> env.step("R1C2 = 2")[1:3]
    (1.1, True)
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, NamedTuple

import numpy as np

from starpo.envs.base import TextEnv
from starpo.envs.sudoku.puzzles import (
    MAX_BLANKS,
    SIZES,
    Deduction,
    candidates,
    count_solutions,
    deduce,
    digits_of,
    geometry,
    make_puzzle,
    next_deduction,
    solve,
)
from starpo.errors import UserError

CORRECT_REWARD = 0.1
WRONG_REWARD = -0.1
SOLVED_BONUS = 1.0
#: Blanks per size when `num_blanks` is not given: a gentle start for small models.
DEFAULT_BLANKS = {4: 6, 9: 30}
#: Actions beyond the blanks in the default budget: room for this many wrong placements.
DEFAULT_SLACK = 4
#: Longest budget accepted: random play fills a blank every ~size actions, so the budget
#: bounds an episode's length.
MAX_STEPS = 1000
#: Longest answer read; "( 2 , 3 ) = 4" is 13 characters, so nothing real is cut.
MAX_ANSWER_CHARS = 40

# re.ASCII: only ASCII digits and spaces (int() would read other scripts' digits too).
_PLACEMENT = re.compile(
    r"(?:r\s*(?P<row>[0-9]{1,2})\s*,?\s*c\s*(?P<col>[0-9]{1,2})"
    r"|\(\s*(?P<prow>[0-9]{1,2})\s*,\s*(?P<pcol>[0-9]{1,2})\s*\))"
    r"\s*=\s*(?P<value>[0-9]{1,2})",
    re.IGNORECASE | re.ASCII,
)

Placement = tuple[int, int, int]  # (row, column, digit), all 1-based


class SudokuState(NamedTuple):
    """A comparable copy of the env state (what `snapshot()` returns)."""

    puzzle: tuple[int, ...]
    grid: tuple[int, ...]
    solution: tuple[int, ...]
    feedback: str
    mistakes: int


class SudokuEnv(TextEnv):
    """Sudoku with one placement per action; wrong placements are rejected with a penalty.

    Args:
        size: grid side, 4 (2x2 boxes) or 9 (3x3 boxes).
        num_blanks: empty cells of a generated puzzle (default 6 for 4x4, 30 for 9x9).
        max_steps: valid actions per episode (default num_blanks + 4); at least num_blanks.
    """

    description: ClassVar[str] = (
        "Sudoku: fill the blanks of a random grid with a unique solution, one digit per action."
    )
    legend = {".": "empty cell"}
    reward_range = (WRONG_REWARD, CORRECT_REWARD + SOLVED_BONUS)
    answer_format = "one placement r<row>c<column>=<digit>, e.g. r2c3=4 (row 2, column 3, digit 4)"

    def __init__(
        self, size: int = 4, num_blanks: int | None = None, max_steps: int | None = None
    ) -> None:
        size, num_blanks, max_steps = _check_args(size, num_blanks, max_steps)
        super().__init__(max_steps)
        self.size = size
        self.num_blanks = num_blanks
        self.instruction = _instruction(size)
        self.puzzle: tuple[int, ...] = ()  # set by reset(); 0 marks a blank
        self.grid: tuple[int, ...] = ()
        self.solution: tuple[int, ...] = ()
        self.feedback = ""
        self.mistakes = 0

    # ---------------------------------------------------------------- TextEnv hooks
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        puzzle = options.pop("puzzle", None)
        if options:
            raise UserError(f"unknown reset options {sorted(options)}; Sudoku accepts: puzzle")
        if puzzle is not None:
            self.puzzle, self.solution = parse_puzzle(puzzle, self.size)
        else:
            cells, solution = make_puzzle(self.np_random, self.size, self.num_blanks)
            self.puzzle, self.solution = tuple(cells), tuple(solution)
        self.grid = self.puzzle
        self.feedback = ""
        self.mistakes = 0
        return {"num_blanks": self.blanks_left}

    def parse_action(self, action: Any) -> Placement | None:
        """(row, column, digit) for a well-formed placement into an empty cell, else None."""
        if not isinstance(action, str) or not self.grid:
            return None
        text = action.strip()
        match = _PLACEMENT.fullmatch(text) if len(text) <= MAX_ANSWER_CHARS else None
        if match is None:
            return None
        row = int(match["row"] or match["prow"])
        col = int(match["col"] or match["pcol"])
        value = int(match["value"])
        if not all(1 <= n <= self.size for n in (row, col, value)):
            return None
        if self.grid[self._cell(row, col)]:
            return None  # a given or an earlier placement: filled cells stay as they are
        return row, col, value

    def action_label(self, action: Placement) -> str:
        row, col, value = action
        return f"r{row}c{col}={value}"

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random digit in a random empty cell (right by chance, 1 in `size`)."""
        blanks = [i for i, value in enumerate(self.grid) if not value] or [0]
        cell = blanks[int(rng.integers(len(blanks)))]
        value = int(rng.integers(1, self.size + 1))
        return self.action_label((cell // self.size + 1, cell % self.size + 1, value))

    def _step(self, action: Placement) -> tuple[float, bool, bool, dict[str, Any]]:
        row, col, value = action
        cell, label = self._cell(row, col), self.action_label(action)
        if value != self.solution[cell]:
            self.mistakes += 1
            self.feedback = (
                f"{label} is wrong: {self._conflict(cell, value)}. The cell stays empty."
            )
            return WRONG_REWARD, False, False, {"correct": False}
        grid = list(self.grid)
        grid[cell] = value
        self.grid = tuple(grid)
        solved = self.is_success()
        self.feedback = f"{label} is correct." + (" The puzzle is solved." if solved else "")
        reward = CORRECT_REWARD + (SOLVED_BONUS if solved else 0.0)
        return reward, solved, True, {"correct": True}

    def render(self) -> str:
        """The grid (rows r1.., columns numbered on top, boxes split by | and -), then the
        last placement's feedback, if any."""
        lines = _grid_lines(self.grid, self.size)
        return "\n".join([*lines, self.feedback] if self.feedback else lines)

    def snapshot(self) -> SudokuState:
        return SudokuState(self.puzzle, self.grid, self.solution, self.feedback, self.mistakes)

    def state_key(self) -> str:
        """The digits of the grid: the feedback line does not change what to do next."""
        return "".join(map(str, self.grid))

    def is_success(self) -> bool:
        return bool(self.grid) and 0 not in self.grid

    @property
    def blanks_left(self) -> int:
        return self.grid.count(0)

    # --------------------------------------------------------------- solver hooks
    def optimal_action(self) -> str | None:
        """A correct placement, easiest first: a cell where only one digit fits, else a
        digit that fits only one cell of a row, column or box, else the cell with the
        fewest candidates. None when the episode is over."""
        if self.done or not self.grid:
            return None
        step = next_deduction(self.grid, self.solution, self.size)
        return None if step is None else self._label(step)

    def optimal_success_probability(self) -> float:
        """1.0 when the steps left cover the blanks left (every placement of the solver is
        correct), else 0.0."""
        if self.is_success():
            return 1.0
        return 1.0 if not self.done and self.steps_left >= self.blanks_left else 0.0

    def explain(self, action: str) -> str | None:
        """Why a correct placement is right, as a person would see it; None for a wrong or
        invalid one."""
        placement = None if self.done else self.parse_action(action)
        if placement is None:
            return None
        cell = self._cell(placement[0], placement[1])
        if placement[2] != self.solution[cell]:
            return None
        return self._rationale(deduce(self.grid, self.solution, self.size, cell))

    # ------------------------------------------------------------------- helpers
    def _cell(self, row: int, col: int) -> int:
        return (row - 1) * self.size + col - 1

    def _label(self, step: Deduction) -> str:
        return self.action_label(
            (step.cell // self.size + 1, step.cell % self.size + 1, step.value)
        )

    def _conflict(self, cell: int, value: int) -> str:
        """Why `value` cannot go in `cell`: a unit that already holds it, else the solution."""
        geo = geometry(self.size)
        r, c, b = geo.rcb[cell]
        for name, unit in (
            (f"row {r + 1}", geo.rows[r]),
            (f"column {c + 1}", geo.cols[c]),
            ("its box", geo.boxes[b]),
        ):
            if any(self.grid[i] == value for i in unit):
                return f"{name} already has a {value}"
        return f"no solution has a {value} there"

    def _rationale(self, step: Deduction) -> str:
        label, size = self._label(step), self.size
        r, c, b = geometry(size).rcb[step.cell]
        if step.kind == "naked":
            seen = ((1 << size) - 1) & ~(1 << (step.value - 1))
            return (
                f"Row {r + 1}, column {c + 1} and the box of r{r + 1}c{c + 1} already hold "
                f"{_and(digits_of(seen))}, so only {step.value} fits there: {label}."
            )
        if step.kind == "hidden":
            unit = {"row": f"row {r + 1}", "column": f"column {c + 1}"}.get(step.unit)
            unit = unit or f"the {box_name(b, size)} box"
            where = {"row": "column or box", "column": "row or box", "box": "row or column"}
            return (
                f"{unit[0].upper()}{unit[1:]} needs a {step.value}, and every other empty cell "
                f"of {unit} already sees a {step.value} in its {where[step.unit]}, so {label}."
            )
        others = digits_of(candidates(self.grid, size, step.cell) & ~(1 << (step.value - 1)))
        fits = _and(sorted([*others, step.value]))
        verb = "leaves" if len(others) == 1 else "each leave"
        return (
            f"Only {fits} fit r{r + 1}c{c + 1}, and {_and(others)} {verb} the puzzle without "
            f"a solution, so {label}."
        )

    def __repr__(self) -> str:
        return (
            f"<SudokuEnv size={self.size} num_blanks={self.num_blanks} max_steps={self.max_steps}>"
        )


# --------------------------------------------------------------------------- text
def box_name(box: int, size: int) -> str:
    """E.g. "top-left"; a 9x9 grid's middle box is the "centre" one."""
    side = geometry(size).box
    vertical = ("top", "bottom") if side == 2 else ("top", "middle", "bottom")
    horizontal = ("left", "right") if side == 2 else ("left", "middle", "right")
    name = f"{vertical[box // side]}-{horizontal[box % side]}"
    return "centre" if name == "middle-middle" else name


def _and(numbers: list[int]) -> str:
    """ "1, 2 and 3"."""
    words = [str(n) for n in numbers]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _grid_lines(grid: tuple[int, ...], size: int) -> list[str]:
    """Rows as "r1  1 . | 3 4": one token per cell, boxes split by | and ----+----."""
    side = geometry(size).box
    stacks = range(0, size, side)
    header = "    " + "   ".join(" ".join(str(c + 1) for c in range(s, s + side)) for s in stacks)
    rule = "    " + "-+-".join("-" * (2 * side - 1) for _ in stacks)
    lines = [header]
    for r in range(size):
        if r and r % side == 0:
            lines.append(rule)
        cells = [str(v) if v else "." for v in grid[r * size : (r + 1) * size]]
        row = " | ".join(" ".join(cells[s : s + side]) for s in stacks)
        lines.append(f"r{r + 1}  {row}")
    return lines


def _instruction(size: int) -> str:
    side = geometry(size).box
    return (
        f"Solve a {size}x{size} Sudoku: fill every empty cell (.) so that each row, each "
        f"column and each {side}x{side} box (split by | and -) holds every digit from 1 to "
        f"{size} once. Rows are labelled r1-r{size} on the left, columns 1-{size} along the "
        "top. Place one digit per action. A correct digit fills its cell; a wrong one is "
        "rejected, leaves the cell empty and still uses an action. Filled cells stay fixed."
    )


# ------------------------------------------------------------------------ arguments
def parse_puzzle(text: Any, size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(puzzle, solution) from a reset option such as "1.34 3412 2143 4321": digits, '.'
    or '0' for blanks, whitespace ignored. It must have a blank and one solution."""
    hint = f"pass {size * size} cells of digits 1-{size} and '.' for blanks, row by row"
    if not isinstance(text, str):
        raise UserError(f"puzzle must be a string, got {type(text).__name__}; {hint}")
    chars = "".join(text.split())
    if len(chars) != size * size or any(ch not in ".0123456789"[: size + 2] for ch in chars):
        raise UserError(f"puzzle {text!r:.100} is not a {size}x{size} grid; {hint}")
    cells = tuple(0 if ch == "." else int(ch) for ch in chars)
    if 0 not in cells:
        raise UserError("puzzle has no blank cell; blank at least one with '.'")
    solutions = count_solutions(cells, size)  # 0 when a digit repeats in a unit
    if solutions != 1:
        problem = "no solution" if solutions == 0 else "more than one solution"
        raise UserError(f"puzzle {text!r:.100} has {problem}; pass one with exactly one")
    solution = solve(cells, size)
    assert solution is not None
    return cells, tuple(solution)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_args(size: Any, num_blanks: Any, max_steps: Any) -> tuple[int, int, int]:
    """Constructor checks, each a one-line UserError naming the argument and the fix."""
    if not _is_int(size) or int(size) not in SIZES:
        raise UserError(f"size must be 4 or 9 (boxes 2x2 or 3x3), got {size!r}; e.g. size=9")
    size = int(size)
    most = MAX_BLANKS[size]
    num_blanks = DEFAULT_BLANKS[size] if num_blanks is None else num_blanks
    if not _is_int(num_blanks) or not 1 <= num_blanks <= most:
        raise UserError(
            f"num_blanks must be an integer from 1 to {most} for size {size}, got "
            f"{num_blanks!r}; e.g. num_blanks={DEFAULT_BLANKS[size]}"
        )
    num_blanks = int(num_blanks)
    max_steps = num_blanks + DEFAULT_SLACK if max_steps is None else max_steps
    if not _is_int(max_steps) or not num_blanks <= max_steps <= MAX_STEPS:
        raise UserError(
            f"max_steps must be an integer from num_blanks ({num_blanks}) to {MAX_STEPS}, "
            f"got {max_steps!r}; e.g. max_steps={num_blanks + DEFAULT_SLACK}"
        )
    return size, num_blanks, int(max_steps)
