"""The best-effort admission pass every policy shares (docs/design.md §4.2).

Walk an ordered list of pending pipelines and grant each one whose demand fits on every one
of its blocks right now, subtracting it before testing the next; skip the rest. Under RDP a
demand fits a block if it fits at *some* live order (docs/design.md §3.3).

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

    def charge(self, available: np.ndarray, pipelines: np.ndarray) -> np.ndarray:
        """``available`` minus the whole demand of ``pipelines``."""
        edges, _ = self.gather(np.asarray(pipelines, dtype=np.intp))
        return self.subtract(available, self.block[edges], self.demand[edges])

    @staticmethod
    def subtract(available: np.ndarray, blocks: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """``available`` minus each row of ``demand`` on its block, one row after another in
        order: the arithmetic of granting the pipelines one by one, as the ledger does, so
        that an exact fit test gives the same answer here and there."""
        left = np.array(available, dtype=float)
        np.subtract.at(left, blocks, demand)
        return left

    def walk(self, available: np.ndarray, order: np.ndarray) -> np.ndarray:
        """The best-effort pass over ``order`` from ``available``: a granted mask over ``order``."""
        order = np.asarray(order, dtype=np.intp)
        n = len(order)
        granted = np.zeros(n, dtype=bool)
        alive = np.ones(n, dtype=bool)
        available = np.array(available, dtype=float)
        edges, owner = self.gather(order)
        by_block = np.argsort(self.block[edges], kind="stable")  # keeps the walk order per block
        owner, demand = owner[by_block], self.demand[edges[by_block]]
        rows, blocks = np.arange(len(owner)), self.block[edges[by_block]]  # rows of ``demand``
        while True:
            # Dropped at once: whatever does not fit now never will in this pass.
            alive[owner[~self._fit_rows(available, demand, rows, blocks, cumulative=False)]] = False
            keep = alive[owner]
            rows, owner, blocks = rows[keep], owner[keep], blocks[keep]
            if not alive.any():
                return granted
            failed, rejected = self._classify(available, n, demand, rows, owner, blocks)
            passes = alive & ~failed
            if not passes.any() and not rejected.any():
                raise ValueError("a pipeline lists the same block twice")
            granted |= passes
            charged = passes[owner]
            available = self.subtract(available, blocks[charged], demand[rows[charged]])
            alive &= ~(passes | rejected)
            keep = alive[owner]
            rows, owner, blocks = rows[keep], owner[keep], blocks[keep]

    def _classify(
        self,
        available: np.ndarray,
        n: int,
        demand: np.ndarray,
        rows: np.ndarray,
        owner: np.ndarray,
        blocks: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One round over the candidates' edges, ``demand[rows]`` (sorted by block, then walk
        position ``owner``): masks over the walk of the candidates that might not fit (the
        others are certain grants) and of the certain rejections."""
        ok = self._fit_rows(available, demand, rows, blocks, cumulative=True)
        failed = np.bincount(owner[~ok], minlength=n) > 0
        # Candidates ahead on the same block that are not certain grants make a failure inconclusive.
        unsure = failed[owner]
        unsure_before = np.cumsum(unsure) - unsure
        first, group = _groups(blocks)
        exact_failure = ~ok & (unsure_before == unsure_before[first][group])
        return failed, np.bincount(owner[exact_failure], minlength=n) > 0

    def _fit_rows(self, available: np.ndarray, demand: np.ndarray, rows: np.ndarray, blocks: np.ndarray, cumulative: bool) -> np.ndarray:
        """Whether each ``demand[rows]`` fits its block (``cumulative``: the running total of
        the block's rows up to it). Worked through in slices of whole blocks so that the
        (rows, K) temporaries stay small."""
        ok = np.empty(len(rows), dtype=bool)
        for part in _slices(blocks):
            part_blocks = blocks[part]
            wanted = demand[rows[part]]
            budget, live = available[part_blocks], self.live[part_blocks]
            if not cumulative:
                ok[part] = self.accounting.fits(wanted, budget, live)
                continue
            running = np.cumsum(wanted, axis=0)
            first, group = _groups(part_blocks)
            before = np.vstack([np.zeros((1, wanted.shape[1])), running[first[1:] - 1]])
            totals = running - before[group]
            fit = self.accounting.fits(totals, budget, live)
            # Running sums round differently from granting one pipeline after another (what
            # the ledger does): rows within rounding distance of their budget are settled by
            # subtracting the rows ahead one by one, as the ledger would.
            near = self.accounting.fits(totals * (1 - 1e-9), budget, live) & ~self.accounting.fits(totals * (1 + 1e-9), budget, live)
            for i in np.flatnonzero(near):
                left = budget[i].copy()
                for ahead in wanted[first[group[i]] : i]:
                    left = left - ahead
                fit[i] = bool(self.accounting.fits(wanted[i], left, live[i]))
            ok[part] = fit
        return ok


#: Rows per slice in :meth:`EdgeTable._fit_rows` (about 1.5 MB per temporary at 12 orders).
SLICE_ROWS = 1 << 14


def _groups(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by block: the first row of each run of equal blocks, and each row's run."""
    new = np.r_[True, blocks[1:] != blocks[:-1]] if len(blocks) else np.zeros(0, dtype=bool)
    return np.flatnonzero(new), np.cumsum(new) - 1


def _slices(blocks: np.ndarray) -> list[slice]:
    """About :data:`SLICE_ROWS` consecutive rows at a time, cut only where the block changes."""
    if len(blocks) <= SLICE_ROWS:
        return [slice(0, len(blocks))]
    cuts = np.searchsorted(blocks, blocks[SLICE_ROWS::SLICE_ROWS], side="left")
    bounds = np.unique(np.r_[0, cuts, len(blocks)])
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def admit_in_order(snapshot: Snapshot, order: np.ndarray) -> np.ndarray:
    """Grant, in ``order``, every pipeline that fits when its turn comes (docs/design.md §4.2).

    Returns the granted pipeline indices in grant order.
    """
    order = np.asarray(order, dtype=np.intp)
    table = EdgeTable.of(snapshot)
    return order[table.walk(snapshot.unlocked, order)]
