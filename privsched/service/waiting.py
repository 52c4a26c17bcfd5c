"""Why a pending pipeline waits: the block and order where its demand falls shortest of the
unlocked budget, by how much, and its rank in the policy's order (after Slurm's reason
codes and ``condor_q -better-analyze``).

A demand d fits a block's unlocked budget u when ``Accounting.fits`` says so (docs/design.md §3.3):
under basic composition d ≤ u in ε and in δ; under RDP d(α) ≤ u(α) at some live order α
(Luo et al., OSDI'21 §4.2). So a pipeline that does not fit is reported at the block where
it is furthest from fitting, with the dimension that decides it: under basic accounting
the one with the largest shortfall d − u (both must fit), under RDP the live order with
the smallest shortfall (one order is enough). A pipeline that fits every block waits
only for its turn: the scheduler's next pass, behind those ranked before it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from privsched.ledger.models import PendingView

if TYPE_CHECKING:  # the remote client reads reasons without loading the policies
    from privsched.policies.base import Policy, Snapshot


@dataclass(frozen=True)
class WaitingReason:
    pipeline_id: int
    code: str  # "budget": does not fit the unlocked budget; "quota": its team's quota; "turn": waits its turn
    rank: int  # 1-based position among the dataset's pending pipelines in the policy's order
    pending: int  # how many pipelines are pending on the dataset
    order: str  # the order ranked in: the serving policy's name, or "arrival"
    block: str | None = None  # the block where the demand falls shortest ("budget" only)
    dimension: str | None = None  # "ε", "δ" or "α=4" where it is decided
    demand: float | None = None  # the demand in that block and dimension
    unlocked: float | None = None  # the unlocked budget there
    shortfall: float | None = None  # demand − unlocked (> 0)
    team: str | None = None  # the team at its quota ("quota" only)

    def text(self) -> str:
        """One short line, for the REASON column and ``status``."""
        rank = f"rank {self.rank}/{self.pending} ({self.order})"
        if self.code == "turn":
            return f"fits now; waits for its turn, {rank}"
        if self.code == "quota":
            return f"quota: team {self.team} would exceed its quota on block {self.block}; {rank}"
        return (f"budget: block {self.block} {self.dimension} needs {self.demand:.4g}, "
                f"unlocked {self.unlocked:.4g} (short {self.shortfall:.4g}); {rank}")

    def short(self) -> str:
        """A few words, for the REASON column of ``privsched list``."""
        if self.code == "turn":
            return f"turn {self.rank}/{self.pending}"
        if self.code == "quota":
            return f"quota {self.team} {self.block}"
        return f"budget {self.block} {self.dimension} short {self.shortfall:.3g}"

    def to_dict(self) -> dict:
        return asdict(self)


def snapshot_of(view: PendingView, now: float = 0.0) -> Snapshot:
    """A policy snapshot of a dataset's pending pipelines (no round-robin reservations)."""
    from privsched.policies.base import Snapshot

    return Snapshot(accounting=view.accounting, capacity=view.capacity, unlocked=view.unlocked,
                    pipeline_ids=view.pipeline_ids, arrival=view.arrival, weight=view.weight,
                    edge_pipeline=view.edge_pipeline, edge_block=view.edge_block, edge_demand=view.edge_demand,
                    clock=now)


def shortfalls(accounting, demand: np.ndarray, available: np.ndarray,
               capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For (E, K) demands against available budgets: whether each fits, the dimension that
    decides (see the module docstring), and the shortfall d − u there (≤ 0 when it fits)."""
    live = accounting.live(capacity)
    fits = accounting.fits(demand, available, live)
    with np.errstate(invalid="ignore"):
        gap = demand - available
    if accounting.is_rdp:  # the closest live order decides
        dim = np.argmin(np.where(live, gap, np.inf), axis=1)
    else:  # the worst dimension decides
        dim = np.argmax(gap, axis=1)
    return fits, dim, gap[np.arange(len(gap)), dim]


def waiting_reasons(view: PendingView, block_keys: dict[int, str], policy: Policy | None = None,
                    now: float = 0.0, quota: Callable | None = None) -> list[WaitingReason]:
    """The reason of every pending pipeline in ``view``; ``block_keys`` maps block ids to
    keys. Ranks follow ``policy.order`` when the policy orders pipelines one by one
    (``per_pipeline_order``), else arrival order. ``quota(pipeline_id, block_ids, demand,
    capacity)`` gives (team, index of the block) when a pipeline that fits the budget
    would exceed its team's quota (:meth:`privsched.ledger.quotas.QuotaCheck.refusal`)."""
    from privsched.policies.fcfs import FirstComeFirstServed

    accounting = view.accounting
    count = len(view.pipeline_ids)
    if count == 0:
        return []
    snapshot = snapshot_of(view, now)
    ranked = policy if policy is not None and getattr(policy, "per_pipeline_order", False) else FirstComeFirstServed()
    order_name = ranked.name if ranked is policy else "arrival"
    rank = np.empty(count, dtype=np.intp)
    rank[ranked.order(snapshot)] = np.arange(1, count + 1)

    demand = view.edge_demand
    unlocked = view.unlocked[view.edge_block]
    fits, dim, edge_gap = shortfalls(accounting, demand, unlocked, view.capacity[view.edge_block])
    labels = accounting.dimension_labels()

    reasons = []
    for p in range(count):
        edges = np.flatnonzero(view.edge_pipeline == p)
        common = dict(pipeline_id=int(view.pipeline_ids[p]), rank=int(rank[p]), pending=count, order=order_name)
        short = edges[~fits[edges]]
        if len(short) == 0:
            blocks = view.block_ids[view.edge_block[edges]]
            over = None if quota is None else quota(common["pipeline_id"], blocks.tolist(), demand[edges],
                                                      view.capacity[view.edge_block[edges]])
            if over is None:
                reasons.append(WaitingReason(code="turn", **common))
            else:
                reasons.append(WaitingReason(code="quota", team=over[0], block=block_keys.get(int(blocks[over[1]])),
                                             **common))
            continue
        e = short[np.argmax(edge_gap[short])]
        d = int(dim[e])
        reasons.append(WaitingReason(
            code="budget", block=block_keys.get(int(view.block_ids[view.edge_block[e]])), dimension=labels[d],
            demand=float(demand[e, d]), unlocked=float(unlocked[e, d]), shortfall=float(edge_gap[e]), **common))
    return reasons
