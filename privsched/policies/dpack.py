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

Only the blocks touched by the last ``k`` grants change between two recomputations, so
counts and costs are refreshed for those blocks alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import RELATIVE_TOLERANCE
from privsched.policies.admission import EdgeTable, spans
from privsched.policies.base import Allocation, Snapshot
from privsched.policies.fcfs import arrival_rank


class _BlockIndex:
    """Rows of an (E, …) table grouped by block: block j owns ``[first_j, first_j + size_j)``."""

    def __init__(self, blocks: np.ndarray, n_blocks: int) -> None:
        self.size = np.bincount(blocks, minlength=n_blocks)
        self.first = np.cumsum(self.size) - self.size
        self.by_block = np.argsort(blocks, kind="stable")

    def rows(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``blocks``, and the position in ``blocks`` of each row."""
        return spans(self.first[blocks], self.size[blocks])


class _Packing:
    """Smallest-first packing counts per block and live order, kept up to date as grants land."""

    def __init__(self, table: EdgeTable, index: _BlockIndex) -> None:
        self.columns = np.flatnonzero(table.live.any(axis=0))
        demand = table.demand[:, self.columns]
        n_edges = len(demand)
        # Sort each column by (block, demand): rank the demand first, then sort an integer key.
        rank = np.empty(demand.shape, dtype=np.int64)
        np.put_along_axis(rank, np.argsort(demand, axis=0), np.arange(n_edges)[:, None], axis=0)
        sorted_edges = np.argsort(table.block[:, None].astype(np.int64) * max(n_edges, 1) + rank, axis=0)
        self.row_of = np.empty_like(sorted_edges)
        np.put_along_axis(self.row_of, sorted_edges, np.arange(n_edges)[:, None], axis=0)
        self.demand = np.take_along_axis(demand, sorted_edges, axis=0)  # zeroed once granted
        self.waiting = np.ones(demand.shape, dtype=bool)
        self.index = index
        self.live = table.live[:, self.columns]
        self.best = np.zeros(table.n_blocks, dtype=np.intp)

    def remove(self, edges: np.ndarray) -> None:
        """Granted edges no longer count as pending."""
        rows, columns = self.row_of[edges], np.arange(len(self.columns))
        self.waiting[rows, columns] = False
        self.demand[rows, columns] = 0.0

    def refresh(self, blocks: np.ndarray, available: np.ndarray) -> None:
        """Recount ``blocks`` (each with at least one edge) against ``available``; update their α*."""
        if not blocks.size or not self.columns.size:
            return  # without a live order nothing fits anywhere: α* is irrelevant
        rows, position = self.index.rows(blocks)
        running = np.cumsum(self.demand[rows], axis=0)
        first = np.cumsum(self.index.size[blocks]) - self.index.size[blocks]
        before = np.vstack([np.zeros((1, running.shape[1])), running[first[1:] - 1]])
        # A sum s ≥ 0 passes ``leq(s, budget)`` iff budget ≥ 0 and s ≤ budget / (1 − tolerance).
        budget = available[blocks][:, self.columns]
        limit = np.where(budget >= 0, budget / (1 - RELATIVE_TOLERANCE), -1.0) + before
        packed = self.waiting[rows] & (running <= limit[position])
        counts = np.add.reduceat(packed.view(np.int8), first, axis=0, dtype=np.int32)
        counts[~self.live[blocks]] = -1
        self.best[blocks] = self.columns[np.argmax(counts, axis=1)]


def best_orders(snapshot: Snapshot) -> np.ndarray:
    """α*_j of every block of an RDP snapshot, as indices into ``accounting.alphas``."""
    if not snapshot.accounting.is_rdp:
        raise ValueError("best orders exist only under rdp accounting")
    table = EdgeTable.of(snapshot)
    index = _BlockIndex(table.block, table.n_blocks)
    packing = _Packing(table, index)
    packing.refresh(np.flatnonzero(index.size), np.asarray(snapshot.unlocked, dtype=float))
    return packing.best


def _edge_costs(table: EdgeTable, available: np.ndarray, edges: np.ndarray, best: np.ndarray | None) -> np.ndarray:
    """Each edge's demand as a fraction of its block's remaining budget (at α*, or the binding dimension)."""
    blocks = table.block[edges]
    if best is None:
        demand, budget = table.demand[edges], available[blocks]
    else:
        demand = table.demand.ravel()[edges * table.demand.shape[1] + best[blocks]][:, None]
        budget = available.ravel()[blocks * available.shape[1] + best[blocks]][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(budget > 0, demand / budget, np.inf)
    return np.where(demand > 0, ratio, 0.0).max(axis=1)


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
        n = snapshot.n_pipelines
        available = np.array(snapshot.unlocked, dtype=float)
        everyone = np.arange(n)
        candidate = table.fits_alone(available, everyone)
        index = _BlockIndex(table.block, table.n_blocks)
        packing = _Packing(table, index) if snapshot.accounting.is_rdp else None
        tie = arrival_rank(snapshot)
        weight = np.asarray(snapshot.weight, dtype=float)
        requesting = np.flatnonzero(table.count)
        edge_cost = np.zeros(len(table.block))
        touched = np.flatnonzero(index.size)
        granted: list[np.ndarray] = []
        while candidate.any():
            if packing is not None:
                packing.refresh(touched, available)
            edges = index.by_block[index.rows(touched)[0]]
            edge_cost[edges] = _edge_costs(table, available, edges, packing.best if packing else None)
            cost = np.zeros(n)
            if requesting.size:
                cost[requesting] = np.add.reduceat(edge_cost, table.start[requesting])
            with np.errstate(divide="ignore", invalid="ignore"):
                urgency = np.where(weight > 0, -weight / cost, 0.0)  # minus the efficiency
            chosen, rejected = self._next_grants(table, available, candidate, urgency, tie)
            granted.append(chosen)
            candidate[chosen] = False
            candidate[rejected] = False
            chosen_edges, _ = table.gather(chosen)
            available = table.charge(available, chosen)
            if packing is not None:
                packing.remove(chosen_edges)
            touched = np.unique(table.block[chosen_edges])
        return Allocation(granted=np.concatenate(granted) if granted else np.zeros(0, dtype=np.intp))

    def _next_grants(
        self, table: EdgeTable, available: np.ndarray, candidate: np.ndarray, urgency: np.ndarray, tie: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The first ``k`` grants of a best-effort walk in descending efficiency, and the
        candidates it rejected before the last of them (they cannot fit later in the pass)."""
        pool = np.flatnonzero(candidate)
        top = 4 * self.k
        while True:
            if top < pool.size:
                threshold = np.partition(urgency[pool], top - 1)[top - 1]
                head = pool[urgency[pool] <= threshold]
            else:
                head = pool
            order = head[np.lexsort((tie[head], urgency[head]))]
            mask = table.walk(available, order)
            if mask.sum() >= self.k or head.size == pool.size:
                break
            top *= 4
        hits = np.flatnonzero(mask)
        settled = hits[self.k - 1] + 1 if hits.size >= self.k else len(order)
        chosen = order[hits[: self.k]]
        return chosen, order[:settled][~mask[:settled]]
