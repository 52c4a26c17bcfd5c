"""DPack, efficiency-oriented privacy budget scheduling (Tholoniat et al., EuroSys'25; docs/design.md §4.2).

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

A round of ``k`` grants costs about what it changes (the blocks its grants touch and the
candidates near the top), not a recount and re-sort of everything:

- Best orders are counted with Fenwick trees, and only on the blocks the last ``k`` grants
  touched (:mod:`privsched.policies.packing`).
- Efficiencies are evaluated lazily. Within a pass unlocked budget only shrinks, so while
  a block keeps its best order every cost ``d / unlocked`` on it can only grow: an
  efficiency computed in an earlier round is an upper bound on the efficiency now.
  Candidates wait in a :class:`~privsched.policies.run_queue.RunQueue` keyed by that
  bound. A round takes the most promising ones, re-evaluates the stale ones, and walks
  those that still beat the bound of everything left in the queue, in exact order, until
  ``k`` grants. When a block's best order changes, costs on it may fall, so the queued
  pipelines on it are re-evaluated at once (and re-queued where their key fell).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.policies.admission import SLICE_ROWS, EdgeTable, spans
from privsched.policies.base import Allocation, Snapshot
from privsched.policies.fcfs import arrival_rank
from privsched.policies.packing import Packing
from privsched.policies.run_queue import RunQueue


def best_orders(snapshot: Snapshot) -> np.ndarray:
    """α*_j of every block of an RDP snapshot, as indices into ``accounting.alphas``."""
    if not snapshot.accounting.is_rdp:
        raise ValueError("best orders exist only under rdp accounting")
    return Packing(EdgeTable.of(snapshot), np.asarray(snapshot.unlocked, dtype=float)).best


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


def _fitting_alone(table: EdgeTable, available: np.ndarray) -> np.ndarray:
    """The pipelines whose whole demand fits ``available`` on its own, tested about
    :data:`SLICE_ROWS` edges at a time so that the temporaries stay small."""
    n_edges = len(table.block)
    cuts = np.unique(np.r_[0, np.searchsorted(table.start, np.arange(0, n_edges, SLICE_ROWS)), len(table.start)])
    parts = [np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    return np.concatenate([part[table.fits_alone(available, part)] for part in parts] or [np.zeros(0, dtype=np.intp)])


class _Ranking:
    """Candidates in descending efficiency, evaluated lazily (see the module docstring).

    Each candidate waits in a :class:`RunQueue` under its urgency (minus its efficiency) as
    of round ``fresh[pipeline]``, a lower bound on its urgency now, ties by arrival rank.
    """

    def __init__(self, snapshot: Snapshot, table: EdgeTable, best: np.ndarray | None) -> None:
        n = snapshot.n_pipelines
        self.table, self.best = table, best
        self.weight = np.asarray(snapshot.weight, dtype=float)
        self.tie = arrival_rank(snapshot)
        self.pipeline = np.asarray(snapshot.edge_pipeline, dtype=np.intp)
        self.by_block = np.argsort(table.block, kind="stable")
        self.block_size = np.bincount(table.block, minlength=table.n_blocks)
        self.urgency = np.zeros(n)
        self.fresh = np.full(n, -1)
        self.round = 0
        self.queue = RunQueue(n)

    def evaluate(self, pipelines: np.ndarray, available: np.ndarray) -> None:
        """Urgency (minus the efficiency) of ``pipelines`` against ``available``, as of this round."""
        if not pipelines.size:
            return
        count = self.table.count[pipelines]
        edges, _ = self.table.gather(pipelines)
        cost = np.zeros(len(pipelines))
        some = count > 0
        if edges.size:
            edge_cost = _edge_costs(self.table, available, edges, self.best)
            cost[some] = np.add.reduceat(edge_cost, (np.cumsum(count) - count)[some])
        weight = self.weight[pipelines]
        with np.errstate(divide="ignore", invalid="ignore"):
            urgency = np.where(weight > 0, -weight / cost, 0.0)
        self.urgency[pipelines] = np.where(np.isnan(urgency), np.inf, urgency)  # NaN sorts last
        self.fresh[pipelines] = self.round

    def push(self, pipelines: np.ndarray) -> None:
        self.queue.push(pipelines, self.urgency[pipelines], self.tie[pipelines])

    def next_round(self, changed: np.ndarray, available: np.ndarray) -> None:
        """Start a round; the queued pipelines on blocks whose α* changed are re-evaluated,
        and re-queued where their queued key is no longer a lower bound."""
        self.round += 1
        if not changed.size:
            return
        start = np.cumsum(self.block_size) - self.block_size
        edges = self.by_block[spans(start[changed], self.block_size[changed])[0]]
        touched = np.unique(self.pipeline[edges])
        touched = touched[self.queue.queued[touched]]
        self.evaluate(touched, available)
        self.push(touched[self.urgency[touched] < self.queue.key[touched]])


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
        available = np.array(snapshot.unlocked, dtype=float)
        packing = Packing(table, available) if snapshot.accounting.is_rdp else None
        ranking = _Ranking(snapshot, table, packing.best if packing else None)
        candidates = _fitting_alone(table, available)
        ranking.evaluate(candidates, available)
        ranking.push(candidates)
        granted: list[np.ndarray] = []
        while len(ranking.queue):
            chosen, available = self._round(table, ranking, available)
            granted.append(chosen)
            if not len(ranking.queue):
                break  # the pass is over: nothing to refresh
            changed = np.zeros(0, dtype=np.intp)
            if packing is not None:
                edges, _ = table.gather(chosen)
                packing.remove(edges)
                changed = packing.refresh(np.unique(table.block[edges]), available)
            ranking.next_round(changed, available)
        return Allocation(granted=np.concatenate(granted) if granted else np.zeros(0, dtype=np.intp))

    def _round(self, table: EdgeTable, ranking: _Ranking, available: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next ``k`` grants of the best-effort walk in descending efficiency as of the
        round's start, and the budget they leave. Candidates the walk rejects on the way are
        dropped (budget only shrinks, so they never fit later in the pass)."""
        basis, need, size = available, self.k, 2 * self.k
        pool = np.zeros(0, dtype=np.intp)  # taken from the queue, evaluated, not walked yet
        chosen: list[np.ndarray] = []
        while need:
            bound = None
            if len(ranking.queue):
                batch, bound = ranking.queue.pop(size)
                ranking.evaluate(batch[ranking.fresh[batch] < ranking.round], basis)
                pool = np.r_[pool, batch]
            if not pool.size:
                break
            pool = pool[np.lexsort((ranking.tie[pool], ranking.urgency[pool]))]
            # Exact keys below every bound left in the queue come first, in this order.
            urgency, tie = ranking.urgency[pool], ranking.tie[pool]
            ahead = pool.size if bound is None else np.count_nonzero(
                (urgency < bound[0]) | ((urgency == bound[0]) & (tie < bound[1])))
            if ahead < need and bound is not None:
                size *= 2  # too few to make k grants: take more before walking
                continue
            certain, pool = pool[:ahead], pool[ahead:]
            mask = table.walk(available, certain)
            hits = np.flatnonzero(mask)
            if hits.size >= need:
                settled = hits[need - 1] + 1
                pool = np.r_[certain[settled:], pool]
                certain, mask = certain[:settled], mask[:settled]
            grants = certain[mask]
            chosen.append(grants)
            available = table.charge(available, grants)
            need -= grants.size
        ranking.push(pool)
        return (np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.intp)), available
