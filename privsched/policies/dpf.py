"""DPF, Dominant Private Block Fairness (Luo et al., OSDI'21 §4.1; docs/design.md §4.2).

A pipeline's dominant share is ``max over its blocks j and live dimensions α of
d_ij(α) / capacity_j(α)`` (the block's total capacity, not what remains). Pipelines are
served smallest dominant share first, as in dominant resource fairness. Ties: the vectors
of all a pipeline's shares, sorted descending, compared lexicographically; then arrival
order; then id. Elastic pipelines are ranked and admitted by their minimum demands, then
topped up in the same order (docs/design.md §4.2, elastic demands).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from privsched.policies.admission import EdgeTable, admit, at_minimum, dominant_shares, edge_shares
from privsched.policies.base import Allocation, Snapshot
from privsched.policies.fcfs import arrival_rank


def _lexicographic_rank(rows: np.ndarray) -> np.ndarray:
    """Rank of each row among the distinct rows, in ascending lexicographic order."""
    rows = np.ascontiguousarray(rows)
    as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(as_bytes, return_index=True, return_inverse=True)
    distinct = rows[first]
    order = np.lexsort(distinct.T[::-1])
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()]


def dpf_order(snapshot: Snapshot) -> np.ndarray:
    """Pending pipelines in DPF order: smallest dominant share first, with its tie-breaks.
    An elastic pipeline is ranked by its minimum demand (docs/design.md §4.2, elastic demands)."""
    snapshot = at_minimum(snapshot)
    table = EdgeTable.of(snapshot)
    n = snapshot.n_pipelines
    shares = edge_shares(snapshot, table)
    dominant = dominant_shares(table, shares)
    _, inverse, counts = np.unique(dominant, return_inverse=True, return_counts=True)
    tied = np.flatnonzero(counts[inverse] > 1)
    second = np.zeros(n, dtype=np.intp)
    if tied.size:
        edges, position = table.gather(tied)
        local = np.arange(edges.size) - (np.cumsum(table.count[tied]) - table.count[tied])[position]
        width = shares.shape[1]
        rows = np.zeros((tied.size, max(int(table.count[tied].max(initial=0)) * width, 1)))
        columns = local[:, None] * width + np.arange(width)
        rows[position[:, None], columns] = shares[edges]
        rows = -np.sort(-rows, axis=1)
        used = np.flatnonzero(rows.any(axis=0))
        rows = rows[:, : used[-1] + 1] if used.size else rows[:, :1]
        second[tied] = _lexicographic_rank(rows)
    return np.lexsort((arrival_rank(snapshot), second, dominant))


@dataclass(frozen=True)
class DominantPrivateBlockFairness:
    """Orders pending pipelines by dominant share and admits best-effort."""

    name: str = "dpf"
    #: Under per-arrival unlocking, each pipeline's fair share 1/N: an elastic pipeline is
    #: topped up no further than it (docs/design.md §4.2, elastic demands).
    fair_share: float | None = None
    per_pipeline_order: ClassVar[bool] = True

    def order(self, snapshot: Snapshot) -> np.ndarray:
        """Pending pipelines in DPF order (a :class:`~privsched.policies.base.PerPipelineOrder`:
        the dominant share and its tie-breaks are keys of each pipeline alone)."""
        return dpf_order(snapshot)

    def allocate(self, snapshot: Snapshot) -> Allocation:
        return admit(snapshot, self.order(snapshot), self.fair_share)
