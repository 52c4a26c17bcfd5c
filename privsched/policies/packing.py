"""Smallest-first packing counts and each block's best RDP order, kept up to date as
pending demands are granted (DPack, Tholoniat et al., EuroSys'25; docs/design.md §4.2).

For block j and live order α, ``count_j(α)`` is how many of the block's pending demands at
α fit in ``unlocked_j(α)`` when packed smallest first: the longest prefix of those demands,
sorted ascending, whose running sum fits. The block's best order α*_j has the largest
count (ties: the smallest α).

The demands of each (block, order) are sorted once, and each keeps its prefix: where it
ends, its pending sum and its count. Within a pass the prefix never grows. Granting a
demand d takes d from the block's budget too: if d lies inside the prefix, the rest of the
prefix still fits (sum − d ≤ budget − d) and the next demand still does not (it did not
fit with d counted), so the count falls by one and the prefix keeps its end; if d lies
beyond, the budget shrank under an unchanged prefix. Either way only shortening can
follow: a recount drops demands from the end until the sum fits again. Each demand
leaves a prefix at most once, so all the recounts of a pass cost O(edges × orders) in
all, and a grant O(orders) (exact arithmetic; in floating point the sums are those of
the grants' subtractions).
"""

from __future__ import annotations

import numpy as np

from privsched.policies.admission import EdgeTable


def _sorted_within_blocks(
    block: np.ndarray, demand: np.ndarray, size: np.ndarray, first: np.ndarray, columns: np.ndarray | None = None
) -> np.ndarray:
    """Edges grouped by block, ascending, and by demand within a block, for each of
    ``columns`` of ``demand`` (E, K) (default: all): an (E, len(columns)) array of edge
    indices (ties in any order: a packing count depends only on the multiset of a block's
    demands).

    Each column is sorted as a (blocks, largest block) table of integers, one short row per
    block (:func:`~privsched.policies.dpack_kernels.table_keys`), which is faster than
    sorting whole columns; when blocks are so uneven that the table would be much larger
    than the edges, whole columns are sorted by demand and then stably by block."""
    columns = np.arange(demand.shape[1]) if columns is None else np.asarray(columns, dtype=np.intp)
    n_blocks, width = len(size), int(size.max(initial=0))
    if n_blocks * width > 4 * len(block) + 4096:
        by_demand = np.argsort(demand[:, columns], axis=0)
        labels = block.astype(np.uint16 if n_blocks <= 1 << 16 else np.intp)[by_demand]
        return np.take_along_axis(by_demand, np.argsort(labels, axis=0, kind="stable"), axis=0)
    from privsched.policies import dpack_kernels

    demand = np.ascontiguousarray(demand, dtype=float)
    by_block = np.empty(len(block), dtype=np.intp)
    low = np.uint64((1 << max(1, (width - 1).bit_length())) - 1)
    keys = np.empty((len(columns), n_blocks, width), dtype=np.uint64)
    dpack_kernels.table_keys(block, demand.view(np.uint64), columns, first, size, low, keys, by_block)
    for table in keys:
        table.sort(axis=1)
    sorted_edges = np.empty((len(block), len(columns)), dtype=np.intp)
    dpack_kernels.edges_in_order(keys, low, by_block, demand, columns, first, size, sorted_edges)
    return sorted_edges


class Packing:
    """Packing counts of every (block, live order) and the best order of every block.

    The loops that lay the demands out, remove granted ones and shorten the prefixes are
    compiled (:mod:`privsched.policies.dpack_kernels`); they take :attr:`state`."""

    def __init__(self, table: EdgeTable, available: np.ndarray) -> None:
        from privsched.policies import dpack_kernels

        self.block = np.ascontiguousarray(table.block, dtype=np.intp)
        self.demand = np.ascontiguousarray(table.quanta, dtype=float)
        self.live = np.ascontiguousarray(table.live, dtype=bool)
        #: Orders live on at least one block; counts cover these columns only.
        self.columns = np.flatnonzero(table.live.any(axis=0)).astype(np.intp)
        n_blocks, n_edges, width = table.n_blocks, len(self.block), len(self.columns)
        self.size = np.bincount(self.block, minlength=n_blocks).astype(np.intp)
        self.first = (np.cumsum(self.size) - self.size).astype(np.intp)
        sorted_edges = _sorted_within_blocks(self.block, self.demand, self.size, self.first, self.columns)
        #: Edges grouped by block (any order within a block).
        self.by_block = np.ascontiguousarray(sorted_edges[:, 0]) if width else np.argsort(self.block, kind="stable")
        #: α*_j as an index into the accounting's orders (0 for blocks nobody asks for).
        self.best = np.zeros(n_blocks, dtype=np.intp)
        #: The state the compiled loops work on: the columns; each block's first row and
        #: size; per column, the demands in sorted order (rows ``first_j ..``) and whether
        #: each has been granted; each edge's row per column; per block and column, the
        #: prefix (rows counted from ``first_j``), its pending sum and count; the best orders.
        self.state = (
            self.columns,
            self.first,
            self.size,
            np.empty((width, n_edges)),
            np.empty((width, n_edges), dtype=bool),
            np.empty((n_edges, width), dtype=np.intp),
            np.zeros((n_blocks, width), dtype=np.intp),
            np.zeros((n_blocks, width)),
            np.zeros((n_blocks, width), dtype=np.intp),
            self.best,
        )
        dpack_kernels.build_packing(
            np.ascontiguousarray(sorted_edges, dtype=np.intp),
            self.demand,
            np.ascontiguousarray(available, dtype=float),
            self.live,
            self.state,
        )

    def remove(self, edges: np.ndarray) -> None:
        """Granted edges stop counting as pending (their demand must already be charged to
        the budget that the next :meth:`refresh` is given)."""
        from privsched.policies import dpack_kernels

        dpack_kernels.remove_edges(np.asarray(edges, dtype=np.intp), self.block, self.demand, self.state)

    def refresh(self, blocks: np.ndarray, available: np.ndarray) -> np.ndarray:
        """Recount ``blocks`` (distinct, each with ≥ 1 edge) against ``available``; update
        their α*. Returns the blocks whose best order changed."""
        from privsched.policies import dpack_kernels

        blocks = np.asarray(blocks, dtype=np.intp)
        if not blocks.size or not self.columns.size:
            return blocks[:0]  # without a live order nothing fits anywhere: α* is irrelevant
        changed = np.empty(len(blocks), dtype=np.intp)
        n_changed = dpack_kernels.refresh_best(blocks, np.ascontiguousarray(available, dtype=float), self.live, self.state, changed)
        return changed[:n_changed]
