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
    """Packing counts of every (block, live order) and the best order of every block.

    The trees are built, updated and descended by the compiled loops of
    :mod:`privsched.policies.dpack_kernels`."""

    def __init__(self, table: EdgeTable, available: np.ndarray) -> None:
        from privsched.policies import dpack_kernels

        #: Orders live on at least one block; counts and trees cover these columns only.
        self.columns = np.flatnonzero(table.live.any(axis=0)).astype(np.intp)
        self.block = np.ascontiguousarray(table.block, dtype=np.intp)
        self.demand = np.ascontiguousarray(table.demand, dtype=float)
        self.live = np.ascontiguousarray(table.live, dtype=bool)
        self.size = np.bincount(table.block, minlength=table.n_blocks).astype(np.intp)
        self.first = (np.cumsum(self.size) - self.size).astype(np.intp)
        #: α*_j as an index into the accounting's orders (0 for blocks nobody asks for).
        self.best = np.zeros(table.n_blocks, dtype=np.intp)
        n_edges, width = len(table.block), len(self.columns)
        sorted_edges = _sorted_within_blocks(self.block, self.demand[:, self.columns], self.size, self.first)
        #: Edges grouped by block (any order within a block).
        self.by_block = np.ascontiguousarray(sorted_edges[:, 0]) if width else np.argsort(self.block, kind="stable")
        #: Row of each edge's demand in the trees, per column.
        self.row_of = np.empty((n_edges, width), dtype=np.intp)
        #: Tree index (1-based, within its block) of each row.
        self.index = np.empty(n_edges, dtype=np.intp)
        #: Per row and column, the tree node's demand sum and pending count side by side
        #: (one cache line serves both).
        self.trees = np.empty((n_edges, width, 2))
        dpack_kernels.build_trees(np.ascontiguousarray(sorted_edges, dtype=np.intp), self.demand, self.columns,
                                  self.first, self.size, self.trees, self.row_of, self.index)
        self.refresh(np.flatnonzero(self.size), available)

    def remove(self, edges: np.ndarray) -> None:
        """Granted edges stop counting as pending: subtract them along their tree paths."""
        from privsched.policies import dpack_kernels

        dpack_kernels.remove_edges(np.asarray(edges, dtype=np.intp), self.block, self.demand, self.columns,
                                   self.first, self.size, self.trees, self.row_of, self.index)

    def refresh(self, blocks: np.ndarray, available: np.ndarray) -> np.ndarray:
        """Recount ``blocks`` (distinct, each with ≥ 1 edge) against ``available``; update
        their α*. Returns the blocks whose best order changed."""
        from privsched.policies import dpack_kernels

        blocks = np.asarray(blocks, dtype=np.intp)
        if not blocks.size or not self.columns.size:
            return blocks[:0]  # without a live order nothing fits anywhere: α* is irrelevant
        changed = np.empty(len(blocks), dtype=np.intp)
        n_changed = dpack_kernels.refresh_best(blocks, np.ascontiguousarray(available, dtype=float), self.live,
                                               self.columns, self.first, self.size, self.trees, self.best,
                                               changed)
        return changed[:n_changed]
