"""DPack, efficiency-oriented privacy budget scheduling (Tholoniat et al., EuroSys'25; DESIGN §4.2).

Under RDP a block's budget is best used at one order: for each block j and live order α,
count how many pending demands fit in ``unlocked_j(α)`` when packed smallest first; the
block's best order α*_j has the largest count (ties: the smallest α). A pipeline's
efficiency is ``e_i = w_i / Σ_j d_ij(α*_j) / unlocked_j(α*_j)``: the weight bought per
fraction of the blocks' remaining budget at their best orders. Pipelines are admitted
best-effort in descending efficiency (ties: arrival, id); best orders and efficiencies are
recomputed every ``k`` grants over the pipelines still pending. Under basic accounting
there is no order to choose and the cost of a block is its binding dimension,
``max(d_ε / unlocked_ε, d_δ / unlocked_δ)``: the area heuristic. A block with no budget
left (``unlocked ≤ 0``) is an infinite cost for any pipeline that needs some of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import leq
from privsched.policies.admission import EdgeTable
from privsched.policies.base import Allocation, Snapshot
from privsched.policies.fcfs import arrival_rank


@dataclass(frozen=True)
class _Packing:
    """Each block's edges sorted by demand at every order, for the smallest-first counts."""

    sorted_edges: np.ndarray  # (E, K) column k: edges grouped by block, ascending demand at k
    sorted_blocks: np.ndarray  # (E,) the block of each row (the same for every column)
    group_start: np.ndarray  # (E,) first row of each row's block

    @classmethod
    def of(cls, table: EdgeTable) -> _Packing:
        n_edges, dims = table.demand.shape
        by_demand = np.argsort(table.demand, axis=0)
        rank = np.empty_like(by_demand)
        np.put_along_axis(rank, by_demand, np.arange(n_edges)[:, None], axis=0)
        key = table.block[:, None].astype(np.int64) * max(n_edges, 1) + rank
        sorted_edges = np.argsort(key, axis=0)
        blocks = table.block[sorted_edges[:, 0]] if n_edges else table.block
        index = np.arange(n_edges)
        start = np.maximum.accumulate(np.where(np.r_[True, blocks[1:] != blocks[:-1]], index, 0)) if n_edges else index
        return cls(sorted_edges, blocks, start)

    def best_orders(self, table: EdgeTable, available: np.ndarray, pending_edge: np.ndarray) -> np.ndarray:
        """α*_j for every block: the live order packing the most pending demands (smallest α on ties)."""
        dims = table.demand.shape[1]
        counts = np.zeros((table.n_blocks, dims))
        if self.sorted_edges.size:
            columns = np.arange(dims)
            waiting = pending_edge[self.sorted_edges]
            demand = np.where(waiting, table.demand[self.sorted_edges, columns], 0.0)
            running = np.cumsum(demand, axis=0)
            start = self.group_start
            before = np.where((start > 0)[:, None], running[start - 1], 0.0)
            packed = waiting & leq(running - before, available[self.sorted_blocks])
            for k in range(dims):
                counts[:, k] = np.bincount(self.sorted_blocks, weights=packed[:, k], minlength=table.n_blocks)
        counts[~table.live] = -1.0
        return np.argmax(counts, axis=1)


def _costs(table: EdgeTable, available: np.ndarray, edges: np.ndarray, best: np.ndarray | None) -> np.ndarray:
    """Each edge's demand as a fraction of its block's remaining budget (at α*, or the binding dimension)."""
    blocks = table.block[edges]
    if best is None:
        demand, budget = table.demand[edges], available[blocks]
    else:
        demand = table.demand[edges, best[blocks]][:, None]
        budget = available[blocks, best[blocks]][:, None]
    ratio = np.where(budget > 0, demand / np.where(budget > 0, budget, 1.0), np.inf)
    return np.where(demand > 0, ratio, 0.0).max(axis=1, initial=0.0)


@dataclass(frozen=True)
class DPack:
    """Admits pending pipelines in descending efficiency, refreshing it every ``k`` grants."""

    k: int = 50
    name: str = "dpack"

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be a positive integer, got {self.k!r}")

    def allocate(self, snapshot: Snapshot) -> Allocation:
        table = EdgeTable.of(snapshot)
        rdp = snapshot.accounting.is_rdp
        available = np.array(snapshot.unlocked, dtype=float)
        everyone = np.arange(snapshot.n_pipelines)
        candidates = everyone[table.fits_alone(available, everyone)]
        owner = np.asarray(snapshot.edge_pipeline, dtype=np.intp)
        pending = np.ones(snapshot.n_pipelines, dtype=bool)
        packing = _Packing.of(table) if rdp else None
        tie = arrival_rank(snapshot)
        weight = np.asarray(snapshot.weight, dtype=float)
        granted: list[np.ndarray] = []
        while candidates.size:
            best = packing.best_orders(table, available, pending[owner]) if packing else None
            edges, position = table.gather(candidates)
            cost = np.bincount(position, weights=_costs(table, available, edges, best), minlength=candidates.size)
            w = weight[candidates]
            efficiency = np.where(w > 0, w / np.where(cost > 0, cost, 1.0), 0.0)
            efficiency[(cost == 0) & (w > 0)] = np.inf
            order = candidates[np.lexsort((tie[candidates], -efficiency))]
            chosen, settled = self._next_grants(table, available, order)
            granted.append(chosen)
            available = table.charge(available, chosen)
            pending[chosen] = False
            candidates = order[settled:]
        return Allocation(granted=np.concatenate(granted) if granted else np.zeros(0, dtype=np.intp))

    def _next_grants(self, table: EdgeTable, available: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, int]:
        """The first ``k`` grants of a best-effort walk over ``order``, and how many entries they settle."""
        length = 2 * self.k
        while True:
            mask = table.walk(available, order[:length])
            if mask.sum() >= self.k or length >= len(order):
                break
            length *= 2
        hits = np.flatnonzero(mask)
        if hits.size < self.k:
            return order[hits], len(order)
        settled = hits[self.k - 1] + 1
        return order[hits[: self.k]], settled
