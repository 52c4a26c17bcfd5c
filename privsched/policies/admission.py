"""The best-effort admission pass every policy shares (DESIGN §4.2).

Walk an ordered list of pending pipelines and grant each one whose demand fits on every one
of its blocks right now, subtracting it before testing the next; skip the rest. Under RDP a
demand fits a block if it fits at *some* live order (DESIGN §3.3).

The walk is vectorised. Within a pass unlocked budget only shrinks, so a pipeline that does
not fit at the start of a round never fits later and is dropped at once. For the others,
the cumulative demand of the ordered candidates on each block is one segmented cumulative
sum. A pipeline whose every block still fits that cumulative demand is granted whatever
happens to the candidates before it (they can only leave more budget). A pipeline that
fails on a block where every earlier candidate was granted is certainly rejected. Both
groups are settled, the survivors form the next round; the first failing candidate is
always settled, so the walk ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.policies.base import Snapshot


def spans(start: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The index ranges ``[start_i, start_i + count_i)`` concatenated, and each index's ``i``."""
    owner = np.repeat(np.arange(len(count)), count)
    offsets = np.cumsum(count) - count
    return np.asarray(start)[owner] + (np.arange(owner.size) - offsets[owner]), owner


@dataclass(frozen=True)
class EdgeTable:
    """A snapshot's edges indexed by pipeline (edges are grouped by pipeline, ascending)."""

    accounting: Accounting
    start: np.ndarray  # (P,) first edge of each pipeline
    count: np.ndarray  # (P,) number of blocks each pipeline requests
    block: np.ndarray  # (E,)
    demand: np.ndarray  # (E, K)
    live: np.ndarray  # (B, K) dimensions that count on each block

    @classmethod
    def of(cls, snapshot: Snapshot) -> EdgeTable:
        pipeline = np.asarray(snapshot.edge_pipeline, dtype=np.intp)
        if pipeline.size and np.any(np.diff(pipeline) < 0):
            raise ValueError("snapshot edges must be grouped by pipeline in ascending order")
        count = np.bincount(pipeline, minlength=snapshot.n_pipelines)
        return cls(
            accounting=snapshot.accounting,
            start=np.cumsum(count) - count,
            count=count,
            block=np.asarray(snapshot.edge_block, dtype=np.intp),
            demand=np.asarray(snapshot.edge_demand, dtype=float),
            live=snapshot.accounting.live(snapshot.capacity),
        )

    @property
    def n_blocks(self) -> int:
        return self.live.shape[0]

    def gather(self, pipelines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Edges of ``pipelines`` in their order, and each edge's position in ``pipelines``."""
        return spans(self.start[pipelines], self.count[pipelines])

    def fits_alone(self, available: np.ndarray, pipelines: np.ndarray) -> np.ndarray:
        """Whether each pipeline's whole demand fits ``available`` (B, K) on its own."""
        edges, owner = self.gather(pipelines)
        blocks = self.block[edges]
        ok = self.accounting.fits(self.demand[edges], available[blocks], self.live[blocks])
        return np.bincount(owner[~ok], minlength=len(pipelines)) == 0

    def block_sums(self, edges: np.ndarray) -> np.ndarray:
        """Total demand of ``edges`` on each block, (B, K)."""
        blocks = self.block[edges]
        demand = self.demand[edges]
        sums = [np.bincount(blocks, weights=demand[:, k], minlength=self.n_blocks) for k in range(demand.shape[1])]
        return np.stack(sums, axis=1)

    def charge(self, available: np.ndarray, pipelines: np.ndarray) -> np.ndarray:
        """``available`` minus the whole demand of ``pipelines``."""
        edges, _ = self.gather(np.asarray(pipelines, dtype=np.intp))
        return available - self.block_sums(edges)

    def walk(self, available: np.ndarray, order: np.ndarray) -> np.ndarray:
        """The best-effort pass over ``order`` from ``available``: a granted mask over ``order``."""
        order = np.asarray(order, dtype=np.intp)
        granted = np.zeros(len(order), dtype=bool)
        alive = np.arange(len(order))
        available = np.array(available, dtype=float)
        while alive.size:
            alive = alive[self.fits_alone(available, order[alive])]
            if not alive.size:
                break
            passes, rejected = self._settle(available, order[alive])
            if not passes.any() and not rejected.any():
                raise ValueError("a pipeline lists the same block twice")
            winners = order[alive[passes]]
            granted[alive[passes]] = True
            available = self.charge(available, winners)
            alive = alive[~passes & ~rejected]
        return granted

    def _settle(self, available: np.ndarray, pipelines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One round: which candidates are certainly granted, which certainly rejected."""
        edges, owner = self.gather(pipelines)
        by_block = np.argsort(self.block[edges], kind="stable")  # keeps the walk order per block
        edges, owner = edges[by_block], owner[by_block]
        blocks = self.block[edges]
        index = np.arange(edges.size)
        group_start = np.maximum.accumulate(np.where(np.r_[True, blocks[1:] != blocks[:-1]], index, 0))
        running = np.cumsum(self.demand[edges], axis=0)
        before_group = np.where((group_start > 0)[:, None], running[group_start - 1], 0.0)
        cumulative = running - before_group
        ok = self.accounting.fits(cumulative, available[blocks], self.live[blocks])
        passes = np.bincount(owner[~ok], minlength=len(pipelines)) == 0
        # Candidates ahead on the same block that are not certain grants make a failure inconclusive.
        unsure = ~passes[owner]
        unsure_before = np.cumsum(unsure) - unsure
        unsure_ahead = unsure_before - unsure_before[group_start]
        exact_failure = ~ok & (unsure_ahead == 0)
        rejected = np.bincount(owner[exact_failure], minlength=len(pipelines)) > 0
        return passes, rejected


def admit_in_order(snapshot: Snapshot, order: np.ndarray) -> np.ndarray:
    """Grant, in ``order``, every pipeline that fits when its turn comes (DESIGN §4.2).

    Returns the granted pipeline indices in grant order.
    """
    order = np.asarray(order, dtype=np.intp)
    table = EdgeTable.of(snapshot)
    return order[table.walk(snapshot.unlocked, order)]
