"""The lean decoder's KV cache: keys and values preallocated per layer and grown rarely,
so a decode step writes one column in place (`DynamicCache` concatenated the whole cache
every step: 54 ms of a 150 ms step at batch 32), and a prompt that many rows share held
once (`KVStore.share`)."""

from __future__ import annotations

import torch


class KVStore:
    """Keys and values of every layer, (rows, kv_heads, capacity, head_dim) each, filled up
    to `length` columns. Growing copies the cache once into a larger buffer; `ensure` is
    asked for a whole turn's room at once, so decode steps never reallocate.

    Rows that start from the same prompt read it from one shared block (`share`) instead
    of a copy each: the first `shared` columns live in per-prompt blocks (prompts,
    kv_heads, shared, head_dim) that row r reads at `shared_rows[r]`, and the per-row
    buffers hold only the columns after them. At the demo's 128 episodes of 4 prompts, the
    ~200-token prompt is held 4 times instead of 128 (1.5 GB less), and attention reads it
    once per prompt instead of once per row. Distinct prompts (an evaluation's cases)
    share their common start the same way: one block of the system prompt for all rows.

    Offers the two `DynamicCache` methods `HFBackend` calls (`batch_select_indices`,
    `get_seq_length`), so the session bookkeeping is shared.
    """

    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, dtype, device):
        self.keys = [torch.empty(rows, kv_heads, 0, head_dim, dtype=dtype, device=device)]
        self.keys *= layers
        self.values = list(self.keys)
        self.length = 0
        self.shared = 0  # columns held in the shared blocks
        self.shared_keys: list[torch.Tensor] = []
        self.shared_values: list[torch.Tensor] = []
        self.shared_rows: torch.Tensor | None = None  # (rows,) block of each row

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.shared + self.keys[0].shape[2]

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

    def share(self, index: torch.Tensor) -> None:
        """Rows become `index` of the current rows (repeats allowed), which turn into the
        shared blocks: nothing is copied per row. Later row selections copy the rows' own
        buffers and remap `shared_rows`.

        A cache that already has blocks (a common system prompt read by every row) folds
        them into the new ones: each new block is its row's old block followed by the
        row's own columns, so a block always starts at column 0. Sharing a prompt start
        with every distinct prompt and then each prompt with its rollouts gives per-prompt
        blocks, as sharing the prompts alone would."""
        spare = self.capacity - self.length  # the turn's reserved room
        self.shared_keys = [self._whole(k, i, self.shared_keys) for i, k in enumerate(self.keys)]
        self.shared_values = [
            self._whole(v, i, self.shared_values) for i, v in enumerate(self.values)
        ]
        self.shared = self.length
        self.shared_rows = index.clone()
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                store[i] = old.new_empty(len(index), old.shape[1], spare, old.shape[3])

    def _whole(self, own: torch.Tensor, layer: int, blocks: list[torch.Tensor]) -> torch.Tensor:
        """Every filled column of each current row of `layer` in one tensor: its shared
        block (when it reads one) followed by its own columns."""
        mine = own[:, :, : self.length - self.shared]
        if not self.shared:
            return mine.clone()
        return torch.cat([blocks[layer][self.shared_rows], mine], dim=2)

    def batch_select_indices(self, index: torch.Tensor) -> None:
        """Keep rows `index`, in that order (repeats copy a row: a shared prompt)."""
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                store[i] = old.index_select(0, index)
        if self.shared_rows is not None:
            self.shared_rows = self.shared_rows[index]

    def sharing_groups(self) -> list[tuple[int, torch.Tensor]]:
        """(block, rows reading it) for every shared block some row reads."""
        if self.shared_rows is None:
            return []
        return [
            (int(block), torch.nonzero(self.shared_rows == block).squeeze(1))
            for block in torch.unique(self.shared_rows)
        ]
