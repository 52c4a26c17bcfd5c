"""Smallest-first packing counts and each block's best RDP order, kept up to date as
pending demands are granted (DPack, Tholoniat et al., EuroSys'25; docs/design.md §4.2).

For block j and live order α, ``count_j(α)`` is how many of the block's pending demands at
α fit in ``unlocked_j(α)`` when packed smallest first: the longest prefix of those demands,
sorted ascending, whose sum fits (up to the budgets' relative tolerance). The block's best
order α*_j has the largest count (ties: the smallest α).

The demands of each (block, order) are sorted once and held in two Fenwick trees (binary
indexed trees, Fenwick 1994): one of demand sums, one of pending counts. Granting a demand
zeroes its leaf in O(log n), and the longest fitting prefix is one descent of the tree in
O(log n). So after a round of grants only the blocks those grants touched are recounted, at
O(orders × log n) each rather than O(orders × n). All trees live side by side in one
(edges, orders) array: the tree of block j uses rows ``first_j + i − 1`` for tree indices
``i = 1..n_j``, the same rows at every order.
"""

from __future__ import annotations

import numpy as np

from privsched.policies.admission import EdgeTable


def _lowest_bit(index: np.ndarray) -> np.ndarray:
    return index & -index


def _sorted_within_blocks(block: np.ndarray, demand: np.ndarray, size: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Edges grouped by block, ascending, and by demand within a block, for every column
    of ``demand`` (E, K): an (E, K) array of edge indices (ties in any order: a packing
    count depends only on the multiset of a block's demands).

    Each column is sorted as a (blocks, largest block) table padded with +inf, one short
    row per block, which is faster than sorting whole columns; when blocks are so uneven
    that the table would be much larger than the edges, whole columns are sorted by demand
    and then stably by block."""
    n_blocks, width = len(size), int(size.max(initial=0))
    if n_blocks * width > 4 * len(block) + 4096:
        by_demand = np.argsort(demand, axis=0)
        labels = block.astype(np.uint16 if n_blocks <= 1 << 16 else np.intp)[by_demand]
        return np.take_along_axis(by_demand, np.argsort(labels, axis=0, kind="stable"), axis=0)
    by_block = np.argsort(block, kind="stable")
    row, slot = block[by_block], np.arange(len(block)) - first[block[by_block]]
    start = np.repeat(first, size)
    padded = np.full((n_blocks, width), np.inf)
    sorted_edges = np.empty(demand.shape, dtype=np.intp)
    for column in range(demand.shape[1]):
        padded[row, slot] = demand[by_block, column]
        local = np.argsort(padded, axis=1)
        sorted_edges[:, column] = by_block[start + local[local < size[:, None]]]
    return sorted_edges


class Packing:
    """Packing counts of every (block, live order) and the best order of every block."""

    def __init__(self, table: EdgeTable, available: np.ndarray) -> None:
        #: Orders live on at least one block; counts and trees cover these columns only.
        self.columns = np.flatnonzero(table.live.any(axis=0))
        self.live = table.live[:, self.columns]
        self.table = table
        self.size = np.bincount(table.block, minlength=table.n_blocks)
        self.first = np.cumsum(self.size) - self.size
        #: α*_j as an index into the accounting's orders (0 for blocks nobody asks for).
        self.best = np.zeros(table.n_blocks, dtype=np.intp)
        demand = table.demand[:, self.columns]
        n_edges = len(demand)
        sorted_edges = _sorted_within_blocks(table.block, demand, self.size, self.first)
        #: Row of each edge's demand in the trees, per column.
        self.row_of = np.empty_like(sorted_edges)
        np.put_along_axis(self.row_of, sorted_edges, np.arange(n_edges)[:, None], axis=0)
        block_of_row = np.repeat(np.arange(table.n_blocks), self.size)
        #: Tree index (1-based, within its block) of each row.
        self.index = np.arange(n_edges) - self.first[block_of_row] + 1
        self.sums = np.take_along_axis(demand, sorted_edges, axis=0)
        self.pending = np.ones(demand.shape)  # float: counts stay exact, updates take the fast path
        self._build(self.size[block_of_row])
        self.refresh(np.flatnonzero(self.size), available)

    def _build(self, block_size: np.ndarray) -> None:
        """Turn the sorted leaves into trees: every node adds itself to its parent, level by
        level (nodes of one level have distinct parents)."""
        step = _lowest_bit(self.index)
        has_parent = self.index + step <= block_size
        bit = 1
        while bit <= block_size.max(initial=0):
            rows = np.flatnonzero(has_parent & (step == bit))
            self.sums[rows + bit] += self.sums[rows]
            self.pending[rows + bit] += self.pending[rows]
            bit <<= 1

    def remove(self, edges: np.ndarray) -> None:
        """Granted edges stop counting as pending: subtract them along their tree paths."""
        if not edges.size or not self.columns.size:
            return
        width = len(self.columns)
        blocks = self.table.block[edges]
        index = self.index[self.row_of[edges]].ravel()
        first, size = np.repeat(self.first[blocks], width), np.repeat(self.size[blocks], width)
        column = np.tile(np.arange(width), len(edges))
        demand = self.table.demand[edges][:, self.columns].ravel()
        flat_sums, flat_pending = self.sums.reshape(-1), self.pending.reshape(-1)
        while index.size:
            flat = (first + index - 1) * width + column
            np.subtract.at(flat_sums, flat, demand)
            np.subtract.at(flat_pending, flat, np.ones(flat.size))
            index = index + _lowest_bit(index)
            active = index <= size
            index, first, size, column, demand = (a[active] for a in (index, first, size, column, demand))

    def counts(self, blocks: np.ndarray, available: np.ndarray) -> np.ndarray:
        """Packing counts (len(blocks), columns) of ``blocks`` (each with ≥ 1 edge) against
        ``available`` (B, K): one descent of each tree to its longest fitting prefix."""
        width = len(self.columns)
        size = self.size[blocks][:, None]
        base = (self.first[blocks][:, None] - 1) * width + np.arange(width)
        # A sum s ≥ 0 passes ``leq(s, budget)`` (exact) iff s ≤ budget.
        limit = available[blocks][:, self.columns]
        position = np.zeros(limit.shape, dtype=np.intp)
        total = np.zeros(limit.shape)
        count = np.zeros(limit.shape)
        flat_sums, flat_pending = self.sums.reshape(-1), self.pending.reshape(-1)
        step = 1 << (int(size.max(initial=1)).bit_length() - 1)
        while step:
            ahead = position + step
            flat = base + np.minimum(ahead, size) * width
            extended = total + flat_sums[flat]
            take = (ahead <= size) & (extended <= limit)
            position += take * step
            total = np.where(take, extended, total)
            count += take * flat_pending[flat]
            step >>= 1
        return count

    def refresh(self, blocks: np.ndarray, available: np.ndarray) -> np.ndarray:
        """Recount ``blocks`` (each with ≥ 1 edge) against ``available``; update their α*.
        Returns the blocks whose best order changed."""
        if not blocks.size or not self.columns.size:
            return blocks[:0]  # without a live order nothing fits anywhere: α* is irrelevant
        counts = self.counts(blocks, available)
        counts[~self.live[blocks]] = -1
        best = self.columns[np.argmax(counts, axis=1)]
        changed = blocks[best != self.best[blocks]]
        self.best[blocks] = best
        return changed
