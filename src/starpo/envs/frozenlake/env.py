"""FrozenLake as a text env: Gymnasium FrozenLake-v1 dynamics on random maps with a path.

The player walks from the start to the goal across frozen tiles; stepping into a hole ends
the episode with reward 0, reaching the goal ends it with reward +1. On slippery ice a move
goes in the intended direction or either perpendicular one, 1/3 each (never backwards);
moving off the grid leaves the player in place.

Random maps follow RAGEN: each tile is frozen with probability `p_frozen`, the start and
goal are two distinct random tiles, and a map is redrawn until a path joins them.

    >>> env = FrozenLakeEnv(is_slippery=False)
    >>> obs, info = env.reset(options={"desc": ["SF", "HG"]})
    >>> print(obs)
    P_
    OG
    >>> env.step("Right")[:3]
    ('_P\\nOG', 0.0, False)
    >>> env.step("Down")[:3]
    ('__\\nO√', 1.0, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any, ClassVar, NamedTuple

import numpy as np

from starpo.envs.base import TextEnv, check_cell_sep, grid_cell
from starpo.envs.frozenlake.solver import (
    ACTIONS,
    FROZEN,
    GOAL,
    HOLE,
    NO_ACTION,
    START,
    Position,
    Solution,
    find_tile,
    next_position,
    shortest_path_length,
    slip_directions,
    solve_with_ties,
)
from starpo.errors import UserError

#: Tile letter -> symbol shown to the agent when the player is elsewhere (as in RAGEN).
TILE_SYMBOLS = {START: "_", FROZEN: "_", HOLE: "O", GOAL: "G"}
#: Tile letter -> symbol shown when the player stands on it.
PLAYER_SYMBOLS = {START: "P", FROZEN: "P", HOLE: "X", GOAL: "√"}
#: Redraws allowed before random map generation gives up (only reachable with tiny p_frozen).
MAX_MAP_TRIES = 10_000

#: Action id -> where a neighbouring tile in that direction lies, in the agent's words.
NEIGHBOUR_WORDS = ("on my left", "below me", "on my right", "above me")

_EXAMPLE_DESC = '["SFFF", "FHFH", "FFFH", "HFFG"]'


class FrozenLakeState(NamedTuple):
    """A hashable copy of the env state (what `snapshot()` returns)."""

    desc: tuple[str, ...]
    position: Position
    in_hole: bool
    on_goal: bool


# ------------------------------------------------------------------------ maps
def validate_desc(desc: Any) -> tuple[str, ...]:
    """An explicit map as a tuple of rows; a malformed one is a one-line UserError."""
    hint = f"pass rows of S/F/H/G letters, e.g. {_EXAMPLE_DESC}"
    if isinstance(desc, str) or not isinstance(desc, Sequence) or not desc:
        raise UserError(f"desc must be a non-empty list of row strings, got {desc!r}; {hint}")
    rows = tuple(desc)
    if any(not isinstance(row, str) or not row for row in rows):
        raise UserError(f"desc rows must be non-empty strings, got {desc!r}; {hint}")
    if len({len(row) for row in rows}) != 1:
        raise UserError(f"desc must be rectangular (all rows the same length), got {desc!r}")
    bad = sorted({tile for row in rows for tile in row} - {START, FROZEN, HOLE, GOAL})
    if bad:
        raise UserError(f"desc has unknown letters {bad}; {hint}")
    for letter, name in ((START, "start"), (GOAL, "goal")):
        count = sum(row.count(letter) for row in rows)
        if count != 1:
            raise UserError(f"desc must have exactly one {letter} ({name}) tile, found {count}")
    return rows


def draw_map(rng: np.random.Generator, size: int, p_frozen: float) -> tuple[str, ...]:
    """One random `size` x `size` map (may have no path): two distinct random tiles become
    start and goal, every other tile is frozen with probability `p_frozen`, else a hole.

    Consumes the generator the same way every call: one `choice`, then one `random` array.
    """
    start, goal = rng.choice(size * size, size=2, replace=False)
    frozen = rng.random((size, size)) < p_frozen
    cells = np.where(frozen, FROZEN, HOLE).ravel()
    cells[start], cells[goal] = START, GOAL
    return tuple("".join(row) for row in cells.reshape(size, size))


def generate_map(
    rng: np.random.Generator, size: int, p_frozen: float, max_tries: int = MAX_MAP_TRIES
) -> tuple[str, ...]:
    """A random map with a path from start to goal: `draw_map` until BFS finds one."""
    for _ in range(max_tries):
        rows = draw_map(rng, size, p_frozen)
        if shortest_path_length(rows) is not None:
            return rows
    raise UserError(
        f"no {size}x{size} map with a path found in {max_tries} tries at p_frozen={p_frozen}; "
        "raise p_frozen"
    )


# ------------------------------------------------------------------------- env
class FrozenLakeEnv(TextEnv):
    """FrozenLake (Gymnasium FrozenLake-v1 dynamics) with text observations.

    Args:
        size: side of the random square maps (>= 2).
        p_frozen: probability that a tile of a random map is frozen (0 < p_frozen <= 1).
        is_slippery: slippery ice (intended move or a perpendicular one, 1/3 each).
        max_steps: episode action budget (valid actions before truncation).
        desc: a fixed map used on every reset instead of random ones, e.g.
            `["SFFF", "FHFH", "FFFH", "HFFG"]`; `reset(options={"desc": ...})` overrides it
            for one episode.
    """

    description: ClassVar[str] = (
        "FrozenLake: reach the goal over slippery ice without falling into a hole."
    )
    action_names = ACTIONS
    legend = {
        "P": "player",
        "_": "frozen ice (safe)",
        "O": "hole",
        "G": "goal",
        "X": "player fallen into a hole",
        "√": "player on the goal",
    }
    reward_range = (0.0, 1.0)

    def __init__(
        self,
        size: int = 4,
        p_frozen: float = 0.8,
        is_slippery: bool = True,
        max_steps: int = 10,
        desc: Sequence[str] | None = None,
        cell_sep: str = "",
        coordinates: bool = False,
    ) -> None:
        """`coordinates`: below the map, the player's, the goal's and the holes' (row,
        column) cells in words, counted from 0 at the top left (as `sokoban-coord` does):
        where a small model may not read positions off the grid's tokens."""
        _check_args(size, p_frozen, is_slippery)
        super().__init__(max_steps)
        self.cell_sep = check_cell_sep(cell_sep)  # between a row's cells (RAGEN: none)
        if not isinstance(coordinates, bool):
            raise UserError(f"coordinates must be true or false, got {coordinates!r}")
        self.coordinates = coordinates
        self.size = int(size)
        self.p_frozen = float(p_frozen)
        self.is_slippery = bool(is_slippery)
        self.fixed_desc = None if desc is None else validate_desc(desc)
        self.instruction = _instruction(self.is_slippery)
        self.desc: tuple[str, ...] | None = None  # the current map, set by reset()
        self.position: Position = (0, 0)
        self._solution_key: tuple[Any, ...] | None = None
        self._solution: Solution | None = None

    # ---------------------------------------------------------------- TextEnv hooks
    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        desc = options.pop("desc", None)
        if options:
            raise UserError(f"unknown reset options {sorted(options)}; FrozenLake accepts: desc")
        if desc is not None:
            self.desc = validate_desc(desc)
        elif self.fixed_desc is not None:
            self.desc = self.fixed_desc
        else:
            self.desc = generate_map(self.np_random, self.size, self.p_frozen)
        self.position = find_tile(self.desc, START)
        return {}

    def _step(self, action_index: int) -> tuple[float, bool, bool, dict[str, Any]]:
        directions = slip_directions(action_index, self.is_slippery)
        direction = directions[0]
        if len(directions) > 1:
            # Exactly one draw per slippery step (none on dry ice), so the same seed and the
            # same actions always give the same transitions.
            direction = directions[int(self.np_random.integers(len(directions)))]
        old = self.position
        self.position = next_position(self._rows(), old, direction)
        tile = self._tile()
        reward = 1.0 if tile == GOAL else 0.0
        extra = {"slipped": direction != action_index}
        return reward, tile in (HOLE, GOAL), self.position != old, extra

    def render(self) -> str:
        """The map in RAGEN's FrozenLake symbols, rows joined by newlines."""
        rows = self._rows()
        pr, pc = self.position
        grid = "\n".join(
            self.cell_sep.join(
                PLAYER_SYMBOLS[tile] if (r, c) == (pr, pc) else TILE_SYMBOLS[tile]
                for c, tile in enumerate(row)
            )
            for r, row in enumerate(rows)
        )
        return f"{grid}\n{self.positions()}" if self.coordinates else grid

    def positions(self) -> str:
        """The player, the goal and the holes as (row, column) cells (the coordinates line
        of `coordinates=True`)."""
        rows = self._rows()
        cells = [(r, c) for r, row in enumerate(rows) for c, tile in enumerate(row)]
        (goal,) = [cell for cell in cells if rows[cell[0]][cell[1]] == GOAL]
        holes = ", ".join(str(cell) for cell in cells if rows[cell[0]][cell[1]] == HOLE)
        return f"Player at {tuple(self.position)}; goal at {goal}; holes at {holes or 'none'}."

    def start_state(self) -> list[int]:
        """The player's cell, [row, column]: with the map (drawn from the seed) all there is."""
        return [int(self.position[0]), int(self.position[1])]

    def _start_at(self, state: Any) -> None:
        rows, cell = self._rows(), grid_cell(state)
        inside = cell is not None and 0 <= cell[0] < len(rows) and 0 <= cell[1] < len(rows[0])
        if not inside or rows[cell[0]][cell[1]] in (HOLE, GOAL):
            raise UserError(
                f"FrozenLake start {state!r} is not a [row, column] of a frozen tile on this "
                f"{len(rows)}x{len(rows[0])} map; pass a value start_state() returned"
            )
        self.position = cell

    def snapshot(self) -> FrozenLakeState:
        """Map, player position and terminal flags (hashable, comparable)."""
        tile = self._tile()
        return FrozenLakeState(self._rows(), self.position, tile == HOLE, tile == GOAL)

    def is_success(self) -> bool:
        return self.desc is not None and self._tile() == GOAL

    # --------------------------------------------------------------- solver hooks
    def optimal_action(self) -> str | None:
        """The optimal action for the current position and steps left (exact finite-horizon
        value iteration); None when the episode is over or no action can reach the goal."""
        if self.done or self.optimal_success_probability() == 0.0:
            return None
        action = int(self._solve().policy[self.steps_left, self._state()])
        return None if action == NO_ACTION else ACTIONS[action]

    def optimal_success_probability(self) -> float:
        """Exact probability that the optimal policy reaches the goal from here within the
        steps left (1 on the goal, 0 in a hole or with no steps left)."""
        return float(self._solve().success_prob[max(self.steps_left, 0), self._state()])

    def good_actions(self) -> frozenset[str] | None:
        """The moves tied for the optimal one: as likely to reach the goal within the steps
        left, and as quickly (on dry ice: each move a cell closer to the goal, around the
        holes). None when the episode is over or the goal is out of reach."""
        if self.done or self.optimal_success_probability() == 0.0:
            return None
        best = self._solve().best[self.steps_left, self._state()]
        return frozenset(ACTIONS[a] for a in np.flatnonzero(best))

    def explain(self, action: str) -> str | None:
        """Why the solver's move is good: where the goal lies, and what the transition model
        says about holes (every tile the move can land on, slips included). None for any
        other action."""
        index = self.action_index(action)
        if index is None or self.action_names[index] != self.optimal_action():
            return None
        rows, name = self._rows(), self.action_names[index]
        landing = {d: next_position(rows, self.position, d) for d in range(len(ACTIONS))}
        holes = [d for d, (r, c) in landing.items() if rows[r][c] == HOLE]
        outcomes = slip_directions(index, self.is_slippery)
        hole = f"hole ({TILE_SYMBOLS[HOLE]})"
        move = f"Moving {name}"
        if len(outcomes) > 1 and landing[index] == self.position:
            # A deliberate bump into the edge: only a slip moves the player.
            slips = [ACTIONS[d] for d in outcomes if landing[d] != self.position]
            move += f" bumps the edge, so I stay or slip {' or '.join(slips)}; it"
        risky = [d for d in outcomes if d in holes]
        if index in risky:
            safety = f"could end in a {hole}"
        elif risky:
            safety = f"could slip {' or '.join(ACTIONS[d] for d in risky)} into a {hole}"
        elif len(outcomes) == 1:
            safety = f"does not step into a {hole}"
        elif holes:
            where = " and ".join(NEIGHBOUR_WORDS[d] for d in holes)
            safety = f"cannot slip into the hole{'s' if len(holes) > 1 else ''} {where}"
        else:
            safety = f"cannot slip into a {hole}"
        if risky:  # the optimal move maximises the chance to reach the goal, risk included
            safety += ", but no other move gives a better chance"
        return f"{self._goal_direction()} {move} {safety}."

    # ------------------------------------------------------------------- helpers
    def _goal_direction(self) -> str:
        """E.g. "The goal (G) is down and to the right." """
        (r, c), (gr, gc) = self.position, find_tile(self._rows(), GOAL)
        vertical = "down" if gr > r else "up" if gr < r else ""
        horizontal = "to the right" if gc > c else "to the left" if gc < c else ""
        where = " and ".join(w for w in (vertical, horizontal) if w)
        if not horizontal:
            where = f"straight {vertical}"
        return f"The goal ({TILE_SYMBOLS[GOAL]}) is {where}."

    def _rows(self) -> tuple[str, ...]:
        if self.desc is None:
            raise RuntimeError("no map yet: call reset() first")
        return self.desc

    def _tile(self) -> str:
        return self._rows()[self.position[0]][self.position[1]]

    def _state(self) -> int:
        return self.position[0] * len(self._rows()[0]) + self.position[1]

    def _solve(self) -> Solution:
        """The value-iteration solution of the current map, computed once per map."""
        key = (self._rows(), self.is_slippery, self.max_steps)
        if key != self._solution_key:
            self._solution = solve_with_ties(self.desc, self.max_steps, self.is_slippery)
            self._solution_key = key
        assert self._solution is not None
        return self._solution

    def __repr__(self) -> str:
        return (
            f"<FrozenLakeEnv size={self.size} p_frozen={self.p_frozen} "
            f"is_slippery={self.is_slippery} max_steps={self.max_steps}>"
        )


def _check_args(size: Any, p_frozen: Any, is_slippery: Any) -> None:
    """Constructor checks, each a one-line UserError naming the argument and the fix."""
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 2 <= size <= 64:
        # 64: a 4096-cell grid is already thousands of prompt tokens; 100000 ran out of memory
        raise UserError(f"size must be an integer from 2 to 64, got {size!r}; e.g. size=4")
    if isinstance(p_frozen, bool) or not isinstance(p_frozen, Real) or not 0 < p_frozen <= 1:
        raise UserError(f"p_frozen must be a number in (0, 1], got {p_frozen!r}; e.g. p_frozen=0.8")
    if not isinstance(is_slippery, (bool, np.bool_)):
        raise UserError(f"is_slippery must be true or false, got {is_slippery!r}")


def _instruction(is_slippery: bool) -> str:
    """The task text for the prompt."""
    text = (
        "You are walking on a frozen lake. Move the player (P) to the goal (G) without "
        "falling into a hole (O)."
    )
    if is_slippery:
        text += (
            " The ice is slippery: a move may take you sideways (perpendicular to the "
            "direction you chose) instead of where you intended."
        )
    return text
