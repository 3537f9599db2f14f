"""Sokoban levels: random generation (solvable within a budget) and the XSB text format.

Generation follows the recipe of gym-sokoban, which RAGEN uses (re-implemented here):

1. topology: a random walk inside the outer walls carves the floor with small brushes;
2. placement: targets go on random floor cells, a box on every target;
3. reverse play: from that solved state the player walks and pulls boxes (a forward push
   played backwards); like gym-sokoban's exhaustive reverse search, every reverse line is
   explored, here breadth-first and only as deep as the action budget, and a state with
   the largest box displacement is kept (ties broken at random);
4. the player then wanders a few random steps, never past the budget.

Breadth-first reverse play from every solved state (any player cell) gives each state its
exact optimal solution length, so the kept level is solvable within the budget by
construction; the optimal solver confirms it (and that the level is not already solved),
and its plan is returned with the level. Randomness comes only from the generator passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from starpo.envs.sokoban.solver import DELTAS, SokobanSolver
from starpo.errors import UserError

Cell = tuple[int, int]
_State = tuple[int, tuple[int, ...]]  # (player, boxes) as flat indices; boxes[i] began on target i

#: Chance the topology walk turns at each step (gym-sokoban's default).
P_CHANGE_DIRECTION = 0.35
#: Most random steps the player wanders after reverse play ("a few", kept within budget).
MAX_PLAYER_STEPS = 3
#: Reverse play stops growing after this many states (bounds time and memory on big rooms
#: with big budgets; distances found so far stay exact, since BFS finds states in order).
MAX_REVERSE_STATES = 100_000
#: Candidate levels tried before generation gives up.
MAX_ATTEMPTS = 1000
#: Floor shapes stamped around the walker, as (row, column) offsets.
BRUSHES: tuple[tuple[Cell, ...], ...] = (
    ((0, 0),),
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
    ((0, 0), (0, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
)


@dataclass(frozen=True)
class SokobanLevel:
    """One board and its start state; cells are (row, column), everything off-grid is wall."""

    shape: tuple[int, int]
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    def is_solved(self) -> bool:
        """Whether every box stands on a target."""
        return self.boxes <= self.targets


def default_num_gen_steps(dim_room: tuple[int, int]) -> int:
    """Topology walk length RAGEN uses: 1.7 x (rows + columns)."""
    return int(1.7 * (dim_room[0] + dim_room[1]))


# ---------------------------------------------------------------------------- generation
def generate_level(
    rng: np.random.Generator,
    dim_room: tuple[int, int],
    num_boxes: int,
    max_steps: int,
    *,
    num_reverse_steps: int | None = None,
    num_gen_steps: int | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> tuple[SokobanLevel, list[str]]:
    """A random level whose optimal solution has 1..`max_steps` actions, and that solution.

    `num_reverse_steps` bounds the depth of reverse play (default `max_steps`; a larger
    value gives harder candidates, and those over budget are redrawn); `num_gen_steps` is
    the topology walk length (default `default_num_gen_steps`). Raises RuntimeError when
    `max_attempts` candidates all fail (a room too small for the boxes, say).
    """
    depth = max_steps if num_reverse_steps is None else num_reverse_steps
    walk = default_num_gen_steps(dim_room) if num_gen_steps is None else num_gen_steps
    for _ in range(max_attempts):
        level = _candidate(rng, dim_room, num_boxes, depth, walk)
        if level is None:
            continue
        solver = SokobanSolver(level.walls, level.targets, level.shape)
        plan = solver.solve(level.boxes, level.player, max_depth=max_steps)
        if plan:  # None: over budget; []: already solved
            return level, plan
    raise RuntimeError(
        f"no solvable {dim_room[0]}x{dim_room[1]} Sokoban level with {num_boxes} box(es) "
        f"within {max_steps} actions after {max_attempts} attempts; "
        "use a larger room, fewer boxes or a larger max_steps"
    )


def _candidate(
    rng: np.random.Generator, dim_room: tuple[int, int], num_boxes: int, depth: int, walk: int
) -> SokobanLevel | None:
    """Steps 1-4 of the recipe once; None when the room is too small or no box can move."""
    rows, cols = dim_room
    floor = random_room_topology(rng, dim_room, walk)
    cells = [i for i, f in enumerate(floor) if f]
    if len(cells) < num_boxes + 2:
        return None
    targets = [cells[i] for i in rng.choice(len(cells), size=num_boxes, replace=False).tolist()]
    distances = reverse_play(floor, cols, targets, depth)
    picked = _most_displaced(rng, distances, targets, cols)
    if picked is None:
        return None
    (player, boxes), distance = picked
    steps = min(MAX_PLAYER_STEPS, depth - distance)
    player = _wander(rng, floor, cols, set(boxes), player, steps)

    def cell(i: int) -> Cell:
        return divmod(i, cols)

    return SokobanLevel(
        shape=(rows, cols),
        walls=frozenset(cell(i) for i, f in enumerate(floor) if not f),
        targets=frozenset(map(cell, targets)),
        boxes=frozenset(map(cell, boxes)),
        player=cell(player),
    )


def random_room_topology(
    rng: np.random.Generator, dim_room: tuple[int, int], num_steps: int
) -> bytearray:
    """Floor mask (flat, row-major; 1 = floor) carved by a random walk inside the border.

    The walker starts on a random inner cell, keeps its direction except with probability
    P_CHANGE_DIRECTION, and stamps a random brush at every position; the floor is therefore
    connected. The outer ring always stays wall.
    """
    rows, cols = dim_room
    floor = bytearray(rows * cols)
    u = rng.random(3 + 3 * num_steps).tolist()  # all draws at once: numpy calls are slow
    r, c = 1 + int(u[0] * (rows - 2)), 1 + int(u[1] * (cols - 2))
    dr, dc = DELTAS[int(u[2] * 4)]
    for k in range(3, 3 + 3 * num_steps, 3):
        if u[k] < P_CHANGE_DIRECTION:
            dr, dc = DELTAS[int(u[k + 1] * 4)]
        for br, bc in BRUSHES[int(u[k + 2] * len(BRUSHES))]:
            if 0 < r + br < rows - 1 and 0 < c + bc < cols - 1:
                floor[(r + br) * cols + c + bc] = 1
        if 0 < r + dr < rows - 1 and 0 < c + dc < cols - 1:
            r, c = r + dr, c + dc
    return floor


def reverse_play(floor: bytearray, cols: int, targets: list[int], depth: int) -> dict[_State, int]:
    """Every state at most `depth` actions from solved, with its exact optimal solution length.

    Breadth-first over reverse actions from all solved states (boxes on `targets`, player on
    any free cell, distance 0): the player steps to a free cell and may pull the box behind
    it. Each reverse action undoes one forward action, so BFS depth is the forward distance.
    Cells are flat row-major indices into a walled `floor` mask `cols` wide.
    """
    offsets = (-cols, cols, -1, 1)
    boxes = tuple(targets)
    distances: dict[_State, int] = {
        (p, boxes): 0 for p, f in enumerate(floor) if f and p not in boxes
    }
    frontier = list(distances)
    for distance in range(1, depth + 1):
        found: list[_State] = []
        for player, boxes in frontier:
            if len(distances) >= MAX_REVERSE_STATES:
                return distances
            for off in offsets:
                step = player + off
                if not floor[step] or step in boxes:
                    continue
                children = [(step, boxes)]
                if player - off in boxes:  # pull it to where the player stood
                    children.append(
                        (step, tuple(player if b == player - off else b for b in boxes))
                    )
                for child in children:
                    if child not in distances:
                        distances[child] = distance
                        found.append(child)
        frontier = found
    return distances


def _most_displaced(
    rng: np.random.Generator, distances: dict[_State, int], targets: list[int], cols: int
) -> tuple[_State, int] | None:
    """A random state among those with the top displacement score, with its distance."""
    scores: dict[tuple[int, ...], int] = {}
    best, top = [], 0
    for state in distances:
        boxes = state[1]
        if boxes not in scores:
            scores[boxes] = _displacement_score(boxes, targets, cols)
        score = scores[boxes]
        if score > top:
            best, top = [state], score
        elif score == top and score > 0:
            best.append(state)
    if not best:
        return None
    state = best[int(rng.integers(len(best)))]
    return state, distances[state]


def _displacement_score(boxes: tuple[int, ...], targets: list[int], cols: int) -> int:
    """Total Manhattan distance of the boxes from their starting targets, times the number
    of boxes moved (so that, with several boxes, moving all of them scores higher)."""
    total = moved = 0
    for box, target in zip(boxes, targets, strict=True):
        (br, bc), (tr, tc) = divmod(box, cols), divmod(target, cols)
        distance = abs(br - tr) + abs(bc - tc)
        total += distance
        moved += distance > 0
    return total * moved


def _wander(
    rng: np.random.Generator, floor: bytearray, cols: int, boxes: set[int], player: int, steps: int
) -> int:
    """The player after 0..`steps` random walking moves (no pushes, no pulls)."""
    if steps <= 0:
        return player
    offsets = (-cols, cols, -1, 1)
    u = rng.random(steps + 1).tolist()
    for k in range(int(u[0] * (steps + 1))):
        moves = [o for o in offsets if floor[player + o] and player + o not in boxes]
        if not moves:
            break
        player += moves[int(u[k + 1] * len(moves))]
    return player


# ------------------------------------------------------------------------------- XSB
XSB_HELP = "use # wall, space/-/_ floor, . goal, $ box, * box on goal, @ player, + player on goal"
_XSB_ROLES = {  # symbol -> (wall, goal, box, player)
    "#": (True, False, False, False),
    " ": (False, False, False, False),
    "-": (False, False, False, False),
    "_": (False, False, False, False),
    ".": (False, True, False, False),
    "$": (False, False, True, False),
    "*": (False, True, True, False),
    "@": (False, False, False, True),
    "+": (False, True, False, True),
}


def parse_xsb(text: str) -> SokobanLevel:
    """A level from XSB text (rows separated by newlines or `|`).

    Ragged rows are padded; floor that the player cannot reach (outside the outer wall,
    say) becomes wall, and a level whose floor touches the edge gets a wall frame, so a
    parsed board is closed like a generated one. A malformed level is a one-line UserError.
    """
    if not isinstance(text, str):
        raise UserError(f"an XSB level must be a string, got {type(text).__name__}")
    lines = [line.rstrip("\r") for line in text.replace("|", "\n").split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UserError(f"the XSB level is empty; {XSB_HELP}")
    walls, goals, boxes, players = set(), set(), set(), []
    for r, line in enumerate(lines):
        for c, symbol in enumerate(line):
            if symbol not in _XSB_ROLES:
                raise UserError(
                    f"XSB level: unknown symbol {symbol!r} at row {r + 1}, column {c + 1}; "
                    + XSB_HELP
                )
            wall, goal, box, player = _XSB_ROLES[symbol]
            for flag, bucket in ((wall, walls), (goal, goals), (box, boxes)):
                if flag:
                    bucket.add((r, c))
            if player:
                players.append((r, c))
    if len(players) != 1:
        raise UserError(f"an XSB level needs exactly one player (@ or +), found {len(players)}")
    if not boxes or len(boxes) != len(goals):
        raise UserError(
            f"an XSB level needs as many goals as boxes, at least one; "
            f"found {len(boxes)} box(es) and {len(goals)} goal(s)"
        )
    shape = (len(lines), max(len(line) for line in lines))
    return _closed_level(shape, walls, goals, boxes, players[0])


def _closed_level(
    shape: tuple[int, int], walls: set[Cell], goals: set[Cell], boxes: set[Cell], player: Cell
) -> SokobanLevel:
    """Wall off every empty cell the player cannot reach, framing the board if it is open.

    Nothing (player or box) can ever enter such a cell, so this changes no solution.
    """
    rows, cols = shape
    reach, stack = {player}, [player]
    while stack:
        r, c = stack.pop()
        for dr, dc in DELTAS:
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < rows and 0 <= nxt[1] < cols and nxt not in walls and nxt not in reach:
                reach.add(nxt)
                stack.append(nxt)
    keep = reach | goals | boxes
    open_edge = any(r in (0, rows - 1) or c in (0, cols - 1) for r, c in keep)
    shift = 1 if open_edge else 0
    rows, cols = rows + 2 * shift, cols + 2 * shift

    def moved(cells: set[Cell]) -> frozenset[Cell]:
        return frozenset((r + shift, c + shift) for r, c in cells)

    kept = moved(keep)
    return SokobanLevel(
        shape=(rows, cols),
        walls=frozenset((r, c) for r in range(rows) for c in range(cols) if (r, c) not in kept),
        targets=moved(goals),
        boxes=moved(boxes),
        player=(player[0] + shift, player[1] + shift),
    )


def format_xsb(level: SokobanLevel) -> str:
    """The level as XSB text (floor as `-`, so no row loses trailing cells)."""
    out = []
    for r in range(level.shape[0]):
        row = []
        for c in range(level.shape[1]):
            cell = (r, c)
            if cell in level.walls:
                row.append("#")
            elif cell == level.player:
                row.append("+" if cell in level.targets else "@")
            elif cell in level.boxes:
                row.append("*" if cell in level.targets else "$")
            else:
                row.append("." if cell in level.targets else "-")
        out.append("".join(row))
    return "\n".join(out)
