"""Optimal Sokoban solver: A* over (player, boxes) states, counting moves as the env does.

The cost of a plan is its number of actions (walks and pushes alike), because that is what
the episode budget counts. The search stays exact while pruning:

- dead squares: a box on a cell from which no push sequence (ignoring other boxes and the
  player) can reach a target will never be on a target, so such pushes are skipped;
- frozen 2x2 blocks: four cells that are all walls or boxes, one of them a box off target,
  can never move again;
- the heuristic (sum over boxes of the pushes still needed, ignoring other boxes) is
  admissible and consistent: one action pushes at most one box by one cell. So the first
  solved state popped is optimal, and a state with `g + h > max_depth` is never needed.

    >>> walls = {(0, c) for c in range(5)} | {(2, c) for c in range(5)} | {(1, 0), (1, 4)}
    >>> solve(walls, targets={(1, 3)}, boxes={(1, 2)}, player=(1, 1))
    ['Right']
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

Cell = tuple[int, int]

#: Action names, in the env's order; DELTAS[i] is the (row, column) change of ACTION_NAMES[i].
ACTION_NAMES: tuple[str, ...] = ("Up", "Down", "Left", "Right")
DELTAS: tuple[Cell, ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))
#: States expanded before a search gives up (a depth-10 search on 8x8 needs a few hundred).
DEFAULT_MAX_NODES = 200_000

_INF = 1 << 30
State = tuple[int, tuple[int, ...]]  # (player index, sorted box indices)


class SearchLimitExceeded(RuntimeError):
    """The search expanded `max_nodes` states without finding or ruling out a solution."""


class SokobanSolver:
    """Shortest plans on one board (walls and targets); boxes and player vary per call.

    Cells are (row, column) pairs on a `shape` grid; every cell outside the grid counts as
    a wall. Internally cells are flat indices into the grid padded by one wall cell on each
    side, so a neighbour is `index + offset` and never wraps around.
    """

    def __init__(
        self, walls: Iterable[Cell], targets: Iterable[Cell], shape: tuple[int, int] | None = None
    ) -> None:
        walls, targets = frozenset(walls), frozenset(targets)
        if shape is None:
            shape = _bounding_shape(walls | targets)
        self.shape = shape
        self._stride = shape[1] + 2
        self._offsets = (-self._stride, self._stride, -1, 1)
        self._floor = bytearray((shape[0] + 2) * self._stride)
        for r in range(shape[0]):
            for c in range(shape[1]):
                if (r, c) not in walls:
                    self._floor[self._index((r, c))] = 1
        self._targets = frozenset(self._checked_index(t, "target") for t in targets)
        self._push_dist = self._pushes_to_target()

    # ------------------------------------------------------------------ board set-up
    def _index(self, cell: Cell) -> int:
        return (cell[0] + 1) * self._stride + cell[1] + 1

    def _checked_index(self, cell: Cell, what: str) -> int:
        r, c = cell
        if not (0 <= r < self.shape[0] and 0 <= c < self.shape[1]):
            raise ValueError(f"{what} {cell} lies outside the {self.shape} board")
        index = self._index(cell)
        if not self._floor[index]:
            raise ValueError(f"{what} {cell} is on a wall")
        return index

    def _pushes_to_target(self) -> list[int]:
        """Per cell: fewest pushes that bring a lone box from there onto a target.

        Backward BFS from the targets: a box reaches `y` from `x = y - off` when the
        player can stand at `x - off`. Cells left at _INF are dead squares.
        """
        floor, dist = self._floor, [_INF] * len(self._floor)
        queue = deque(self._targets)
        for t in self._targets:
            dist[t] = 0
        while queue:
            y = queue.popleft()
            for off in self._offsets:
                x = y - off
                if floor[x] and floor[x - off] and dist[x] == _INF:
                    dist[x] = dist[y] + 1
                    queue.append(x)
        return dist

    def _frozen(self, box: int, boxes: tuple[int, ...]) -> bool:
        """Whether `box` now sits in a 2x2 block of walls/boxes holding a box off target."""
        floor, s = self._floor, self._stride
        for corner in (box, box - 1, box - s, box - s - 1):
            square = (corner, corner + 1, corner + s, corner + s + 1)
            if all(not floor[c] or c in boxes for c in square) and any(
                c in boxes and c not in self._targets for c in square
            ):
                return True
        return False

    # ------------------------------------------------------------------------ search
    def solve(
        self,
        boxes: Iterable[Cell],
        player: Cell,
        max_depth: int | None = None,
        max_nodes: int = DEFAULT_MAX_NODES,
    ) -> list[str] | None:
        """A shortest list of action names that puts every box on a target, or None.

        None means no plan of at most `max_depth` actions exists (any length when None).
        Raises SearchLimitExceeded when `max_nodes` states were expanded without an answer.
        """
        start_boxes = tuple(sorted(self._checked_index(b, "box") for b in boxes))
        start: State = (self._checked_index(player, "player"), start_boxes)
        if start[0] in start_boxes:
            raise ValueError(f"the player {player} stands on a box")
        limit = _INF if max_depth is None else max_depth
        h0 = sum(self._push_dist[b] for b in start_boxes)
        if h0 >= _INF or h0 > limit:  # a box on a dead square, or too far for the budget
            return None
        parents: dict[State, tuple[State, int] | None] = {start: None}
        best_g = {start: 0}
        heap = [(h0, 0, 0, start)]  # (f, -g, insertion order, state): deeper first on ties
        pushed = expanded = 0
        while heap:
            f, neg_g, _, state = heapq.heappop(heap)
            g = -neg_g
            if g > best_g[state]:
                continue  # a stale entry: the state was reached more cheaply since
            if f == g:  # h == 0: every box is on a target
                return self._plan(parents, state)
            expanded += 1
            if expanded > max_nodes:
                raise SearchLimitExceeded(
                    f"expanded {max_nodes} states without a verdict; raise max_nodes"
                )
            for action, child, h in self._successors(state, f - g):
                if g + 1 + h > limit or g + 1 >= best_g.get(child, _INF):
                    continue
                best_g[child] = g + 1
                parents[child] = (state, action)
                pushed += 1
                heapq.heappush(heap, (g + 1 + h, -(g + 1), pushed, child))
        return None

    def _successors(self, state: State, h: int) -> list[tuple[int, State, int]]:
        """(action, next state, its heuristic) for every move that changes the state."""
        player, boxes = state
        floor, dist, out = self._floor, self._push_dist, []
        for action, off in enumerate(self._offsets):
            step = player + off
            if not floor[step]:
                continue
            if step not in boxes:
                out.append((action, (step, boxes), h))
                continue
            beyond = step + off
            if not floor[beyond] or beyond in boxes or dist[beyond] == _INF:
                continue
            moved = tuple(sorted(beyond if b == step else b for b in boxes))
            if self._frozen(beyond, moved):
                continue
            out.append((action, (step, moved), h - dist[step] + dist[beyond]))
        return out

    @staticmethod
    def _plan(parents: dict[State, tuple[State, int] | None], state: State) -> list[str]:
        actions = []
        link = parents[state]
        while link is not None:
            state, action = link
            actions.append(ACTION_NAMES[action])
            link = parents[state]
        return actions[::-1]


def _bounding_shape(cells: Iterable[Cell]) -> tuple[int, int]:
    cells = list(cells)
    if not cells:
        return (0, 0)
    if min(min(r, c) for r, c in cells) < 0:
        raise ValueError("cells must have non-negative coordinates")
    return (max(r for r, _ in cells) + 1, max(c for _, c in cells) + 1)


def solve(
    walls: Iterable[Cell],
    targets: Iterable[Cell],
    boxes: Iterable[Cell],
    player: Cell,
    max_depth: int | None = None,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> list[str] | None:
    """A shortest action-name plan putting every box on a target, or None if none exists.

    Cells are (row, column) pairs; the board spans the bounding box of all given cells and
    everything outside it is wall. See `SokobanSolver.solve` for the limits.
    """
    walls, targets, boxes = frozenset(walls), frozenset(targets), frozenset(boxes)
    shape = _bounding_shape(walls | targets | boxes | {player})
    return SokobanSolver(walls, targets, shape).solve(boxes, player, max_depth, max_nodes)
