"""The lean decoder's KV cache: keys and values preallocated per layer and grown rarely,
so a decode step writes one column in place (`DynamicCache` concatenated the whole cache
every step: 54 ms of a 150 ms step at batch 32), and a prompt that many rows share held
once (`KVStore.share`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SharedLevel:
    """One level of the shared prompt tree: `blocks` blocks of `columns` columns each,
    (blocks, kv_heads, columns, head_dim) a layer, and the block each row reads."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    rows: torch.Tensor  # (rows,) block of each row

    @property
    def columns(self) -> int:
        return self.keys[0].shape[2]

    def groups(self) -> list[tuple[int, torch.Tensor]]:
        """(block, rows reading it) for every block some row reads."""
        return [
            (int(block), torch.nonzero(self.rows == block).squeeze(1))
            for block in torch.unique(self.rows)
        ]


class KVStore:
    """Keys and values of every layer, (rows, kv_heads, capacity, head_dim) each, filled up
    to `length` columns. Growing copies the cache once into a larger buffer; `ensure` is
    asked for a whole turn's room at once, so decode steps never reallocate.

    Rows that start from the same prompt read it from one shared block (`share`) instead
    of a copy each. The first `shared` columns live in `levels`, a prefix tree: level 0's
    blocks come first in every row, then level 1's, and the per-row buffers hold only the
    columns after them. An RL step's tree has two levels: the system prompt (a tool env's
    ~500 tokens of schemas and rules) once for all rows, then each group's case prompt
    once for the group's rollouts; an evaluation's (every case its own prompt) has the
    first alone. At the demo's 128 episodes of 4 prompts, the ~200-token prompt is held 4
    times instead of 128 (1.5 GB less), and attention reads a block once per step for all
    the rows that read it, instead of once per row.

    Offers the two `DynamicCache` methods `HFBackend` calls (`batch_select_indices`,
    `get_seq_length`), so the session bookkeeping is shared.
    """

    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, dtype, device):
        self.keys = [torch.empty(rows, kv_heads, 0, head_dim, dtype=dtype, device=device)]
        self.keys *= layers
        self.values = list(self.keys)
        self.length = 0
        self.levels: list[SharedLevel] = []

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def shared(self) -> int:
        """Columns held in the shared levels."""
        return sum(level.columns for level in self.levels)

    @property
    def capacity(self) -> int:
        return self.shared + self.keys[0].shape[2]

    def held_bytes(self) -> int:
        """Bytes the cache holds: the rows' buffers and every shared block."""
        tensors = [*self.keys, *self.values]
        for level in self.levels:
            tensors += [*level.keys, *level.values]
        return sum(t.nbytes for t in tensors)

    def get_seq_length(self) -> int:
        return self.length

    def ensure(self, columns: int) -> None:
        """Room for `columns` columns in all, shared ones included (the per-row buffers
        grow at least 1.5x, in steps of 8: every spare column is held for every row)."""
        if columns <= self.capacity:
            return
        own = columns - self.shared
        capacity = -(-max(own, self.keys[0].shape[2] * 3 // 2) // 8) * 8
        filled = self.length - self.shared
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_empty(old.shape[0], old.shape[1], capacity, old.shape[3])
                new[:, :, :filled] = old[:, :, :filled]
                store[i] = new

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor):
        """Put (rows, kv_heads, L, head_dim) at the end of `layer`; return the filled views
        of the per-row buffers (the caller advances `length` once all layers are written)."""
        start = self.length - self.shared
        end = start + keys.shape[2]
        self.keys[layer][:, :, start:end] = keys
        self.values[layer][:, :, start:end] = values
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def compact(self, order: torch.Tensor, columns: int) -> None:
        """Each row's own columns become its columns `order[row, :columns]`, in that order:
        the rows' real columns moved to the front, so the padding a batch accumulates (a
        rectangular cache gives every row the longest row's chunk each turn, and a column
        each decode step after its reply ended) is no longer held nor read. One copy of the
        own columns, in place; the capacity stays."""
        index = order[:, None, :columns, None]
        for store in (self.keys, self.values):
            for old in store:
                gathered = old.gather(2, index.expand(-1, old.shape[1], -1, old.shape[3]))
                old[:, :, :columns] = gathered
        self.length = self.shared + columns

    def share(self, index: torch.Tensor) -> None:
        """Rows become `index` of the current rows (repeats allowed), and the current rows'
        own columns become a new level of shared blocks, one a current row: nothing is
        copied per row. The levels before keep their blocks (a system prompt shared by
        every case stays one block when each case's prompt is then shared by its
        rollouts). Later row selections copy the rows' own buffers and remap the levels."""
        spare = self.capacity - self.length  # the turn's reserved room
        own = self.length - self.shared
        for level in self.levels:
            level.rows = level.rows[index]
        if own:
            self.levels.append(
                SharedLevel(
                    [k[:, :, :own].clone() for k in self.keys],
                    [v[:, :, :own].clone() for v in self.values],
                    index.clone(),
                )
            )
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                store[i] = old.new_empty(len(index), old.shape[1], spare, old.shape[3])

    def batch_select_indices(self, index: torch.Tensor) -> None:
        """Keep rows `index`, in that order (repeats copy a row: a shared prompt)."""
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                store[i] = old.index_select(0, index)
        for level in self.levels:
            level.rows = level.rows[index]

    def shared_columns(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row's shared columns of `layer`, copied out of the levels' blocks:
        (rows, kv_heads, shared, head_dim) keys and values."""
        keys = [level.keys[layer][level.rows] for level in self.levels]
        values = [level.values[layer][level.rows] for level in self.levels]
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)
