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

- Best orders are recounted only on the blocks the last ``k`` grants touched, and a
  recount only shortens each order's packed prefix (:mod:`privsched.policies.packing`).
- Efficiencies are evaluated lazily (the accelerated greedy of Minoux, 1978). Within a
  pass unlocked budget only shrinks, so while a block keeps its best order every cost
  ``d / unlocked`` on it can only grow (IEEE division and addition round monotonically): an
  efficiency computed in an earlier round is an upper bound on the efficiency now, and the
  efficiency itself while none of the pipeline's blocks has been granted anything since.
  Candidates wait in a binary heap keyed by that bound (minus it, an urgency; ties by
  arrival rank). The round pops the smallest key: a stale one is evaluated against the
  round's starting budget and pushed again; an exact one comes next in exact order, since
  every other key is a lower bound, and is granted if it fits (dropped otherwise: it never
  fits later in the pass). When a block's best order changes, a cost on it may fall: the
  queued pipelines whose cost on that block fell are re-evaluated at once and pushed again
  where their key fell (for the others, every cost is still at least what their key was
  computed from).

The loops run compiled (:mod:`privsched.policies.dpack_kernels`); the set-up here is NumPy.
They run on budgets in exact quanta (:mod:`privsched.budgets.exact`) held as float64
integers: within the quanta's range (below 2⁵³) every comparison and every subtraction that
leaves a budget non-negative is exact, and one that would go below zero stays below zero,
so the fit test is the ledger's. A team's quota is one more block per team and block
(:meth:`~privsched.policies.admission.EdgeTable.admitting`): its room counts in the
efficiency like any block's remaining budget. Elastic pipelines are packed by their
minimum demands, then topped up in grant order (docs/design.md §4.2, elastic demands).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.policies.admission import EdgeTable, at_minimum, is_elastic, top_up
from privsched.policies.base import Allocation, Snapshot
from privsched.policies.fcfs import arrival_rank
from privsched.policies.packing import Packing


def best_orders(snapshot: Snapshot) -> np.ndarray:
    """α*_j of every block of an RDP snapshot, as indices into ``accounting.alphas``."""
    if not snapshot.accounting.is_rdp:
        raise ValueError("best orders exist only under rdp accounting")
    table, available = EdgeTable.admitting(snapshot)
    return Packing(table, available.astype(float)).best[: snapshot.n_blocks]


@dataclass(frozen=True)
class DPack:
    """Admits pending pipelines in descending efficiency, refreshing it every ``k`` grants."""

    k: int = 50
    name: str = "dpack"
    #: Under per-arrival unlocking, 1/N: how far an elastic pipeline is topped up (as DPF's).
    fair_share: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be a positive integer, got {self.k!r}")

    def allocate(self, snapshot: Snapshot) -> Allocation:
        if is_elastic(snapshot):  # who on the minimums, then topped up in grant order
            granted = self.allocate(at_minimum(snapshot)).granted
            return Allocation(granted=granted, fraction=top_up(snapshot, granted, self.fair_share))
        from privsched.policies import dpack_kernels

        table, quanta = EdgeTable.admitting(snapshot)
        available = np.array(quanta, dtype=float, order="C")
        is_rdp = bool(snapshot.accounting.is_rdp)
        packing = Packing(table, available) if is_rdp else None
        start, count = table.start.astype(np.intp), table.count.astype(np.intp)
        block = np.ascontiguousarray(table.block, dtype=np.intp)
        demand = np.ascontiguousarray(table.quanta, dtype=float)
        live = np.ascontiguousarray(table.live, dtype=bool)
        candidates = dpack_kernels.fitting_alone(start, count, block, demand, available, live, is_rdp)
        granted = dpack_kernels.run_pass(
            candidates,
            start,
            count,
            np.ascontiguousarray(snapshot.weight, dtype=float),
            arrival_rank(snapshot).astype(np.intp),
            block,
            demand,
            available,
            live,
            is_rdp,
            min(self.k, len(candidates) + 1),  # a round never grants more than every candidate
            np.repeat(np.arange(snapshot.n_pipelines, dtype=np.intp), count),  # each edge's pipeline, quota twins included
            *_packing_arguments(packing, table),
        )
        return Allocation(granted=granted.astype(np.intp))


def _packing_arguments(packing: Packing | None, table: EdgeTable) -> tuple:
    """What :func:`~privsched.policies.dpack_kernels.run_pass` takes of the packing counts;
    empty arrays under basic accounting, which has no order to choose."""
    if packing is not None:
        return packing.by_block, packing.state
    none = np.zeros(0, dtype=np.intp)
    blocks = np.zeros(table.n_blocks, dtype=np.intp)
    empty = np.zeros((0, 0), dtype=np.intp)
    return none, (none, blocks, blocks, np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), empty, empty, np.zeros((0, 0)), empty, blocks)
