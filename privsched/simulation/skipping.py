"""Which allocation passes the simulator may skip, and over which pipelines (docs/design.md §4.3).

Every admission is a best-effort pass (docs/design.md §4.2), and budget only comes back at the
next unlock, so a pass can be skipped or narrowed when it provably changes no decision:
- After a pass no pending pipeline fits. A pipeline can fit at a later instant only if it
  arrived, or if one of its blocks gained budget (an unlock step above 0); watch lists (:mod:`.watch`) find those
  among the pending ones without looking at the others. When none fits, the pass would
  grant nothing and is skipped.
- Policies whose order is a key of each pipeline alone (FCFS, DPF: ``PerPipelineOrder``)
  rank every pipeline of the workload once, with their own ``order``. A pass then sorts the
  pipelines that fit by that rank (the others cannot be granted in this pass and do not
  change the order of the rest) and walks them best-effort: grant the first, re-check the
  rest against what is left, and again; after a few grants the rest is one vectorised
  walk (:func:`~privsched.policies.admission.admit_in_order`).
- Other policies (DPack) see every pending pipeline, except that when the pipelines that
  fit also fit all together, any best-effort pass grants them all, whatever its order:
  they are granted without calling the policy (still counted as a pass; not under elastic
  demands, where the policy decides how much each receives).
- Under elastic demands (docs/design.md §4.2) a pipeline "fits" when its minimum does, and
  a per-pipeline-order pass is one call of :func:`~privsched.policies.admission.admit`
  over the fitting pipelines in rank order (who on the minimums, then the top-ups).
Policies that set budget aside between passes (round robin, ``Allocation.reserved``) get a
pass at every instant, over the pipelines it can change. :class:`EveryInstant` is the
reference without any of this (one full pass at every instant); the tests check that
both give the same grants at the same times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from privsched.budgets.exact import sum_at, value
from privsched.policies.admission import admit, admit_in_order, top_up
from privsched.policies.base import PerPipelineOrder, orders_per_pipeline
from privsched.simulation.instance import Instance
from privsched.simulation.status import PENDING
from privsched.simulation.watch import BlockMembers, WatchLists

if TYPE_CHECKING:
    from privsched.simulation.engine import Simulator

#: A per-pipeline-order pass grants this many pipelines one at a time, re-checking the rest
#: after each, then walks what still fits at once (:func:`~privsched.policies.admission.admit_in_order`).
GREEDY_GRANTS = 4


def rank_everyone(instance: Instance, policy: PerPipelineOrder) -> np.ndarray:
    """Each pipeline's position in the policy's order over the whole workload: sorting any
    subset by it gives the policy's order of that subset (DPF's dominant share and its
    tie-breaks, FCFS's arrival, depend on each pipeline alone)."""
    everyone, _ = instance.snapshot(np.arange(instance.n_pipelines), np.zeros_like(instance.capacity))
    rank = np.empty(instance.n_pipelines, dtype=np.int64)
    rank[policy.order(everyone)] = np.arange(instance.n_pipelines)
    return rank


class EveryInstant:
    """One full policy pass at every instant with a pending pipeline."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def allocate(self, now: float, arrived: np.ndarray, dirty: list[np.ndarray], upto: int) -> None:
        if self.sim.n_pending:
            self.sim.full_pass(now, self.sim.pending(upto))


class PassSkipping:
    """The allocation pass of each instant, skipped or narrowed where it cannot matter
    (module docstring)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        inst = sim.inst
        self.rank: np.ndarray | None = None  # (P,) position in the policy's order, if per pipeline
        if orders_per_pipeline(sim.spec.policy):
            self.rank = rank_everyone(inst, sim.spec.policy)  # type: ignore[arg-type]
            sim.reserving = False  # a best-effort pass sets nothing aside
        self.watch = WatchLists(inst.n_blocks, sim.acc.dims, sim.acc.is_rdp, sim.live, sim.status, PENDING)
        self.members: BlockMembers | None = None  # for policies that set budget aside
        self.carry = np.zeros(0, dtype=np.int64)  # pipelines that still fitted after the last pass

    def allocate(self, now: float, arrived: np.ndarray, dirty: list[np.ndarray], upto: int) -> None:
        """The allocation pass of one instant: ``arrived`` pipelines just arrived, the blocks
        in ``dirty`` gained budget, pipelines before ``upto`` have arrived."""
        sim = self.sim
        if sim.reserving:
            self._water_fill_pass(now, arrived, dirty)
            return
        if sim.reserving is None:  # the first pass tells whether the policy sets budget aside
            if sim.n_pending:
                sim.full_pass(now, sim.pending(upto))
                if sim.reserving is False:  # start watching
                    self.carry = self._check(sim.pending(upto))
                else:  # track who asks for each block
                    self.members = BlockMembers(sim.inst.n_blocks, sim.status, PENDING)
                    self._members_add(sim.pending(upto))
            return
        fitting = self._fitting(arrived, dirty)
        self.carry = fitting[:0]
        if fitting.size == 0:
            return
        if self.rank is not None:
            self._ranked_pass(now, fitting, self.rank)
            return
        if not self.sim.inst.is_elastic and self._fit_together(fitting):
            # A best-effort pass in any order grants every pipeline that fits when the
            # fitting ones fit all together (in particular a lone one). How much an elastic
            # one receives is the policy's to say.
            sim.passes += 1
            sim.grant(now, fitting, checked=True)
            return
        granted = sim.full_pass(now, sim.pending(upto))
        self.carry = self._check(np.setdiff1d(fitting, granted, assume_unique=True))

    def _fitting(self, arrived: np.ndarray, dirty: list[np.ndarray]) -> np.ndarray:
        """Pending pipelines that fit now: among those that arrived, the watchers of blocks
        that gained budget, and those that still fitted after the last pass."""
        found = [a for a in (arrived, self.carry) if a.size]
        if dirty:
            blocks = self.watch.worth_scanning(_distinct(dirty), self.sim.unlocked)
            for j in blocks.tolist():
                watchers = self.watch.may_fit(j, self.sim.unlocked[j])
                if watchers.size:
                    found.append(watchers)
        if not found:
            return np.zeros(0, dtype=np.int64)
        candidates = found[0] if len(found) == 1 else np.unique(np.concatenate(found))
        return self._check(candidates[self.sim.status[candidates] == PENDING])

    def _check(self, pipelines: np.ndarray) -> np.ndarray:
        """The pipelines whose whole demand (an elastic one's minimum) fits the unlocked
        budget; each of the others watches the first of its blocks where it does not fit."""
        edges: slice | np.ndarray
        if len(pipelines) == 1:
            i = int(pipelines[0])
            edges, blocks = self.sim.edge_span[i], self.sim.block_span[i]
            demand = self.sim.minimum[edges]
            ok = self.sim.acc.fits_units(demand, self.sim.unlocked[blocks], self.sim.live[blocks])
            if ok.all():
                return pipelines
            first = edges.start + int(np.argmin(ok))  # the first block where it does not fit
            witness = slice(first, first + 1)
            self.watch.watch(pipelines, self.sim.inst.edge_block[witness], self.sim.minimum[witness])
            return pipelines[:0]
        if not len(pipelines):
            return pipelines
        edges, owner = self.sim.inst.edges_of(pipelines)
        blocks = self.sim.inst.edge_block[edges]
        demand = self.sim.minimum[edges]
        ok = self.sim.acc.fits_units(demand, self.sim.unlocked[blocks], self.sim.live[blocks])
        if ok.all():
            return pipelines
        failing = np.flatnonzero(~ok)
        failing_owner = owner[failing]  # ascending: edges are grouped by pipeline
        first = np.flatnonzero(np.concatenate(([True], failing_owner[1:] != failing_owner[:-1])))
        losers, failed_at = failing_owner[first], failing[first]
        self.watch.watch(pipelines[losers], blocks[failed_at], demand[failed_at])
        keep = np.ones(len(pipelines), dtype=bool)
        keep[losers] = False
        return pipelines[keep]

    def _ranked_pass(self, now: float, fitting: np.ndarray, rank: np.ndarray) -> None:
        """The best-effort pass of a policy whose order is per pipeline, over the pipelines
        that fit (the others cannot be granted and do not change the order of the rest), in
        its order: the first one is granted, the rest are checked against what is left
        (those that no longer fit never will in this pass, and start watching), and so on.
        After a few grants the rest is walked at once."""
        self.sim.passes += 1
        order = fitting[np.argsort(rank[fitting])] if len(fitting) > 1 else fitting
        if self.sim.inst.is_elastic:  # who on the minimums, then topped up in that order
            snapshot, _ = self.sim.inst.snapshot(order, value(self.sim.unlocked), now)
            fair_share = getattr(self.sim.spec.policy, "fair_share", None)
            if len(order) == 1:  # its minimum fits: granted, and topped up
                self.sim.grant(now, order, checked=True, fraction=top_up(snapshot, np.zeros(1, dtype=np.intp), fair_share))
                return
            allocation = admit(snapshot, np.arange(len(order)), fair_share)
            granted = np.asarray(allocation.granted, dtype=np.intp)
            self.sim.grant(now, order[granted], checked=True, fraction=allocation.fraction)
            self._check(np.setdiff1d(order, order[granted]))
            return
        for _ in range(GREEDY_GRANTS):
            self.sim.grant(now, order[:1], checked=True)
            order = self._check(order[1:])
            if not order.size:
                return
        snapshot, _ = self.sim.inst.snapshot(order, value(self.sim.unlocked), now)
        walked = np.zeros(len(order), dtype=bool)
        walked[admit_in_order(snapshot, np.arange(len(order)))] = True
        self.sim.grant(now, order[walked], checked=True)
        self._check(order[~walked])

    def _members_add(self, pipelines: np.ndarray) -> None:
        edges, owner = self.sim.inst.edges_of(pipelines)
        assert self.members is not None, "members are tracked once the policy sets budget aside"
        self.members.add(pipelines[owner], self.sim.inst.edge_block[edges])

    def _water_fill_pass(self, now: float, arrived: np.ndarray, dirty: list[np.ndarray]) -> None:
        """A pass of a policy that sets budget aside, over the pipelines it can change: those
        that arrived and those asking for a block that gained budget. After a water-filling
        pass every other block has nothing left to give, or nobody left to fill."""
        self._members_add(arrived)
        assert self.members is not None
        found = [arrived] + [self.members.of(j) for j in (_distinct(dirty).tolist() if dirty else [])]
        pipelines = np.unique(np.concatenate(found))
        pipelines = pipelines[self.sim.status[pipelines] == PENDING]
        if pipelines.size:
            self.sim.full_pass(now, pipelines)

    def _fit_together(self, pipelines: np.ndarray) -> bool:
        """Whether the pipelines' summed demands fit the unlocked budget on every block."""
        if len(pipelines) == 1:
            return True
        edges, _ = self.sim.inst.edges_of(pipelines)
        blocks = self.sim.inst.edge_block[edges]
        total = sum_at(len(self.sim.unlocked), blocks, self.sim.demand[edges])
        touched = np.unique(blocks)
        return bool(np.all(self.sim.acc.fits_units(total[touched], self.sim.unlocked[touched], self.sim.live[touched])))


def _distinct(arrays: list[np.ndarray]) -> np.ndarray:
    """The distinct entries of a non-empty list of arrays that each hold distinct entries."""
    return arrays[0] if len(arrays) == 1 else np.unique(np.concatenate(arrays))
