"""The best-effort admission pass every policy shares (DESIGN §4.2).

Walk an ordered list of pending pipelines and grant each one whose demand fits on every one
of its blocks right now, subtracting it before testing the next; skip the rest. Under RDP a
demand fits a block if it fits at *some* live order (DESIGN §3.3).

The walk is vectorised, in rounds. Within a pass unlocked budget only shrinks, so a
pipeline that does not fit at the start of a round never fits later and is dropped at once.
For the others, the cumulative demand of the ordered candidates on each block is one
segmented cumulative sum. A pipeline whose every block still fits that cumulative demand is
granted whatever happens to the candidates before it (they can only leave more budget). A
pipeline that fails on a block where every earlier candidate is such a certain grant is
certainly rejected. Both groups are settled and the certain grants charged; the survivors
form the next round. Charging a certain grant before a survivor that comes earlier in the
walk is harmless: on their shared blocks the grant's own test already counted the
survivor's demand. The first failing candidate is always settled, so the walk ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.policies.base import Snapshot


def validate(snapshot: Snapshot) -> None:
    """Raise ValueError (one line) unless the snapshot's arrays agree with each other."""
    dims, n_blocks, n = snapshot.accounting.dims, snapshot.n_blocks, snapshot.n_pipelines
    if np.shape(snapshot.capacity) != (n_blocks, dims) or np.shape(snapshot.unlocked) != (n_blocks, dims):
        raise ValueError(f"capacity and unlocked must both have shape (blocks, {dims})")
    if np.shape(snapshot.arrival) != (n,) or np.shape(snapshot.weight) != (n,):
        raise ValueError("arrival and weight need one entry per pending pipeline")
    n_edges = len(snapshot.edge_pipeline)
    if len(snapshot.edge_block) != n_edges or np.shape(snapshot.edge_demand) != (n_edges, dims):
        raise ValueError(f"edge_pipeline, edge_block and edge_demand (edges, {dims}) must have one row per edge")
    pipeline, block = np.asarray(snapshot.edge_pipeline), np.asarray(snapshot.edge_block)
    if n_edges and (pipeline.min() < 0 or pipeline.max() >= n or block.min() < 0 or block.max() >= n_blocks):
        raise ValueError("an edge refers to a pipeline or block that is not in the snapshot")
    if n_edges and np.any(np.diff(pipeline) < 0):
        raise ValueError("snapshot edges must be grouped by pipeline in ascending order")
    if not np.all(np.isfinite(snapshot.edge_demand)) or np.any(np.asarray(snapshot.edge_demand) < 0):
        raise ValueError("demands must be finite and non-negative")


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
        validate(snapshot)
        pipeline = np.asarray(snapshot.edge_pipeline, dtype=np.intp)
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

    def block_sums(self, blocks: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """Total of ``demand`` (E', K) per block, given each row's block: (B, K)."""
        sums = [np.bincount(blocks, weights=demand[:, k], minlength=self.n_blocks) for k in range(demand.shape[1])]
        return np.stack(sums, axis=1)

    def charge(self, available: np.ndarray, pipelines: np.ndarray) -> np.ndarray:
        """``available`` minus the whole demand of ``pipelines``."""
        edges, _ = self.gather(np.asarray(pipelines, dtype=np.intp))
        return available - self.block_sums(self.block[edges], self.demand[edges])

    def walk(self, available: np.ndarray, order: np.ndarray) -> np.ndarray:
        """The best-effort pass over ``order`` from ``available``: a granted mask over ``order``."""
        order = np.asarray(order, dtype=np.intp)
        n = len(order)
        granted = np.zeros(n, dtype=bool)
        alive = np.ones(n, dtype=bool)
        available = np.array(available, dtype=float)
        edges, owner = self.gather(order)
        by_block = np.argsort(self.block[edges], kind="stable")  # keeps the walk order per block
        owner, blocks, demand = owner[by_block], self.block[edges[by_block]], self.demand[edges[by_block]]
        while True:
            # Dropped at once: whatever does not fit now never will in this pass.
            ok = self.accounting.fits(demand, available[blocks], self.live[blocks])
            alive[owner[~ok]] = False
            keep = alive[owner]
            owner, blocks, demand = owner[keep], blocks[keep], demand[keep]
            if not alive.any():
                return granted
            failed, rejected = self._settle(available, n, owner, blocks, demand)
            passes = alive & ~failed
            if not passes.any() and not rejected.any():
                raise ValueError("a pipeline lists the same block twice")
            granted |= passes
            charged = passes[owner]
            available = available - self.block_sums(blocks[charged], demand[charged])
            alive &= ~(passes | rejected)
            keep = alive[owner]
            owner, blocks, demand = owner[keep], blocks[keep], demand[keep]

    def _settle(
        self, available: np.ndarray, n: int, owner: np.ndarray, blocks: np.ndarray, demand: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One round over the candidates' edges (sorted by block, then walk position
        ``owner``): masks over the walk of the candidates that might not fit (the others
        are certain grants) and of the certain rejections."""
        index = np.arange(len(blocks))
        group_start = np.maximum.accumulate(np.where(np.r_[True, blocks[1:] != blocks[:-1]], index, 0))
        running = np.cumsum(demand, axis=0)
        before_group = np.where((group_start > 0)[:, None], running[group_start - 1], 0.0)
        ok = self.accounting.fits(running - before_group, available[blocks], self.live[blocks])
        failed = np.bincount(owner[~ok], minlength=n) > 0
        # Candidates ahead on the same block that are not certain grants make a failure inconclusive.
        unsure = failed[owner]
        unsure_before = np.cumsum(unsure) - unsure
        exact_failure = ~ok & (unsure_before == unsure_before[group_start])
        return failed, np.bincount(owner[exact_failure], minlength=n) > 0


def admit_in_order(snapshot: Snapshot, order: np.ndarray) -> np.ndarray:
    """Grant, in ``order``, every pipeline that fits when its turn comes (DESIGN §4.2).

    Returns the granted pipeline indices in grant order.
    """
    order = np.asarray(order, dtype=np.intp)
    table = EdgeTable.of(snapshot)
    return order[table.walk(snapshot.unlocked, order)]
