"""Round robin, the OSDI'21 baseline (Luo et al. §6; docs/design.md §4.2), basic accounting only.

Unlocked budget on each block is water-filled evenly among the pipelines waiting on it: each
gets the same amount, except that none gets more than it still needs, and what a small
demand leaves over is spread among the others. The water-filling runs per dimension (ε, δ).
A pipeline is granted once every one of its blocks has filled its demand. Budget set aside
is carried in ``Snapshot.reserved`` / ``Allocation.reserved`` (one row per edge); what was
set aside for a pipeline that times out is lost. Under team quotas filled pipelines are
granted in arrival order as far as their teams' quotas go, and what was set aside for one
its quota holds back returns to the block (docs/design.md §4.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import leq
from privsched.budgets.exact import BUDGET
from privsched.policies.admission import EdgeTable, is_elastic, validate
from privsched.policies.base import Allocation, Snapshot
from privsched.policies.fcfs import arrival_rank


def water_fill(blocks: np.ndarray, need: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Split each block's ``budget`` (B,) evenly among its edges' ``need`` (E,), capped at the need.

    Returns each edge's share. Sorting a block's needs ``r_1 ≤ … ≤ r_n``, the first ``m``
    are filled completely where ``m`` is the largest count with
    ``r_1 + … + r_m + (n − m) r_m ≤ budget``; the others all get the level
    ``(budget − r_1 − … − r_m) / (n − m)``.
    """
    give = np.zeros(len(need))
    waiting = np.flatnonzero(need > 0)
    if not waiting.size:
        return give
    waiting = waiting[np.lexsort((need[waiting], blocks[waiting]))]
    b, r = blocks[waiting], need[waiting]
    index = np.arange(len(b))
    new_group = np.r_[True, b[1:] != b[:-1]]
    group = np.cumsum(new_group) - 1
    first = index[new_group]
    size = np.diff(np.r_[first, len(b)])
    running = np.cumsum(r)
    before = np.where(first > 0, running[first - 1], 0.0)
    prefix = running - before[group]
    after = first[group] + size[group] - index - 1
    available = np.maximum(budget[b], 0.0)
    filled = leq(prefix + after * r, available)  # non-decreasing cost along each group
    m = np.bincount(group, weights=filled, minlength=len(first)).astype(np.intp)
    spent = np.where(m > 0, prefix[first + np.maximum(m, 1) - 1], 0.0)
    rest = np.maximum(size - m, 1)
    level = np.maximum(budget[b[first]] - spent, 0.0) / rest
    give[waiting] = np.where(filled, r, np.minimum(level[group], r))
    return give


def remaining_need(demand: np.ndarray, reserved: np.ndarray) -> np.ndarray:
    """What each edge still needs (E, K) beyond its reservation: ``max(d − reserved, 0)``,
    0 where the reservation already holds the demand (``leq``)."""
    need = np.maximum(demand - reserved, 0.0)
    need[leq(demand, reserved)] = 0.0
    return need


def fill_requirement(blocks: np.ndarray, need: np.ndarray) -> np.ndarray:
    """For each edge, the budget its block must have free for :func:`water_fill` to fill the
    edge's ``need`` (E,) completely: ``Σ_k min(r_k, r_e)`` over the edges k waiting on the
    same block (r > 0), 0 for an edge that needs nothing.

    :func:`water_fill` fills the m-th smallest need exactly when
    ``r_1 + … + r_m + (n − m) r_m ≤ budget``, and that sum is ``Σ_k min(r_k, r_m)``: the
    edge is filled once every edge of its block has received as much as it (or all it needs).
    """
    required = np.zeros(len(need))
    waiting = np.flatnonzero(need > 0)
    for block in sorted(set(blocks[waiting].tolist())):  # not np.unique, which loads numpy.ma
        mine = waiting[blocks[waiting] == block]
        r = need[mine]
        ordered = np.sort(r)
        prefix = np.r_[0.0, np.cumsum(ordered)]
        below = np.searchsorted(ordered, r, side="right")  # needs ≤ r, its own included
        required[mine] = prefix[below] + (len(r) - below) * r
    return required


@dataclass(frozen=True)
class RoundRobin:
    """Drips unlocked budget evenly into waiting pipelines and grants the ones it fills."""

    name: str = "rr"

    def allocate(self, snapshot: Snapshot) -> Allocation:
        if snapshot.accounting.is_rdp:
            raise ValueError("round robin supports basic accounting only (use dpf or dpack under rdp)")
        validate(snapshot)
        if is_elastic(snapshot):
            raise ValueError("round robin takes fixed demands only (use fcfs, dpf or dpack for elastic demands)")
        demand = np.asarray(snapshot.edge_demand, dtype=float)
        blocks = np.asarray(snapshot.edge_block, dtype=np.intp)
        old = np.zeros_like(demand) if snapshot.reserved is None else np.asarray(snapshot.reserved, dtype=float)
        need = remaining_need(demand, old)
        owner = np.asarray(snapshot.edge_pipeline, dtype=np.intp)
        quota = _QuotaWalk.of(snapshot)
        if quota is not None:  # what a quota holds back is filled no further
            need[quota.held_back[owner]] = 0.0
        new = old + np.stack([water_fill(blocks, need[:, k], snapshot.unlocked[:, k]) for k in range(demand.shape[1])], axis=1)
        if quota is not None:
            new[quota.held_back[owner]] = 0.0  # and what was set aside for it goes back
        complete = np.all(leq(demand, new), axis=1)
        new[complete] = demand[complete]
        waiting = np.bincount(owner[~complete], minlength=snapshot.n_pipelines) > 0
        rank = arrival_rank(snapshot)
        granted = np.flatnonzero(~waiting)
        granted = granted[np.argsort(rank[granted])]
        if quota is not None:  # filled ones, in arrival order, as far as their teams' quotas go
            within = quota.table.walk(quota.available, granted)
            new[np.isin(owner, granted[~within])] = 0.0  # filled but over quota: set aside no longer
            granted = granted[within]
        return Allocation(granted=granted, reserved=new)


@dataclass(frozen=True)
class _QuotaWalk:
    """Team quotas under round robin: the admission table with every real block unbounded
    (a filled pipeline's reservation already holds its demand there), so that only the
    teams' rooms decide (:meth:`~privsched.policies.admission.EdgeTable.admitting`)."""

    table: EdgeTable
    available: np.ndarray
    held_back: np.ndarray  # (P,) pipelines whose team's room cannot hold them even alone

    @classmethod
    def of(cls, snapshot: Snapshot) -> _QuotaWalk | None:
        if snapshot.quotas is None:
            return None
        table, available = EdgeTable.admitting(snapshot)
        available[: snapshot.n_blocks] = BUDGET
        return cls(table, available, ~table.fits_alone(available, np.arange(snapshot.n_pipelines)))
