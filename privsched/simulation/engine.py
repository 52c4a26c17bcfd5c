"""The discrete-event simulator: the scheduler's semantics without waiting (docs/design.md §4.1, §4.3).

At every instant the events are applied in the order block arrivals, unlocks (per-time
ticks), pipeline arrivals (with their per-arrival unlocks), timeouts; then one allocation
pass calls ``spec.policy.allocate(snapshot)``, the very code the live scheduler calls.
Unlocking raises each block to the fraction the live scheduler computes too
(:func:`~privsched.policies.unlock.unlocked_fraction`), per-time rules on the grid
``first block arrival + k · tick`` (:attr:`Simulator.grid`). A lone arriving pipeline's
blocks are raised one by one in Python floats with the same bits (the ``block_*`` twins in
:mod:`privsched.policies.unlock`), skipping blocks with nothing left locked.

Every admission is a best-effort pass (docs/design.md §4.2), and budget only comes back at the
next unlock, so the loop skips work that cannot change any decision:
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
  they are granted without calling the policy (still counted as a pass).
- Timeouts are applied before each pass rather than at instants of their own: a timeout
  alone never enables a grant.
Policies that set budget aside between passes (round robin, ``Allocation.reserved``) get a
full pass at every instant. ``shortcuts=False`` turns all of this off (one full pass at
every instant); the tests check that both give the same grants at the same times.
"""

from __future__ import annotations

import bisect
import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from privsched.policies.admission import admit_in_order
from privsched.policies.base import Allocation, PerPipelineOrder, PolicySpec, orders_per_pipeline
from privsched.policies.unlock import (
    UnlockGrid,
    block_unlock_amounts,
    block_unlock_step,
    block_unlocked_fraction,
    unlock_amounts,
    unlock_step,
    unlocked_fraction,
)
from privsched.simulation.instance import Instance
from privsched.simulation.watch import BlockMembers, WatchLists, fits

NOT_ARRIVED, PENDING, GRANTED, TIMED_OUT = 0, 1, 2, 3
STATUS_NAMES = ("not_arrived", "pending", "granted", "timed_out")

#: Default per-time unlock period: 1 s, clipped so that a block unlocks in 10 to 100 ticks.
DEFAULT_TICK, MIN_TICKS, MAX_TICKS = 1.0, 10, 100

#: A per-pipeline-order pass grants this many pipelines one at a time, re-checking the rest
#: after each, then walks what still fits at once (:func:`~privsched.policies.admission.admit_in_order`).
GREEDY_GRANTS = 4

_NO_BLOCKS = np.zeros(0, dtype=np.int64)


def rank_everyone(instance: Instance, policy: PerPipelineOrder) -> np.ndarray:
    """Each pipeline's position in the policy's order over the whole workload: sorting any
    subset by it gives the policy's order of that subset (DPF's dominant share and its
    tie-breaks, FCFS's arrival, depend on each pipeline alone)."""
    everyone, _ = instance.snapshot(np.arange(instance.n_pipelines), np.zeros_like(instance.capacity))
    rank = np.empty(instance.n_pipelines, dtype=np.int64)
    rank[policy.order(everyone)] = np.arange(instance.n_pipelines)
    return rank


@dataclass
class RunState:
    """What a finished run leaves: per-pipeline outcome and per-block budget."""

    status: np.ndarray  # (P,) codes, see STATUS_NAMES
    grant_time: np.ndarray  # (P,) nan unless granted
    consumed: np.ndarray  # (B, K) granted budget (the simulator's jobs spend all they get)
    wasted: np.ndarray  # (B, K) budget set aside for pipelines that timed out
    sample_times: np.ndarray  # (S,)
    sample_consumed: np.ndarray  # (S, B, K) consumed budget at each sample time
    passes: int  # allocation passes run


class Simulator:
    """Runs one policy over one compiled workload."""

    def __init__(
        self,
        instance: Instance,
        spec: PolicySpec,
        *,
        tick: float | None = None,
        samples: int = 100,
        shortcuts: bool = True,
    ) -> None:
        self.inst = instance
        self.spec = spec
        self.acc = instance.accounting
        per_time = spec.unlock.on_tick(1.0) > 0
        if tick is None and per_time:
            lifetime = 1.0 / spec.unlock.on_tick(1.0)
            tick = min(max(DEFAULT_TICK, lifetime / MAX_TICKS), lifetime / MIN_TICKS)
        if tick is not None and not (tick > 0 and math.isfinite(tick)):
            raise ValueError(f"tick must be a positive number of seconds, got {tick!r}")
        self.tick = tick if per_time else None
        self.samples = samples
        self.shortcuts = shortcuts
        self.unlock_per_arrival = spec.unlock.on_pipeline_arrival()
        #: The instants of per-time unlocking (None for the other rules).
        self.grid = UnlockGrid(float(instance.block_arrival[0]), tick) if self.tick and instance.n_blocks else None

        B, K, P = instance.n_blocks, self.acc.dims, instance.n_pipelines
        self.cap = instance.capacity
        self.live = self.acc.live(self.cap)
        self.locked = self.cap.copy()
        self.unlocked = np.zeros((B, K))
        self.consumed = np.zeros((B, K))
        self.wasted = np.zeros((B, K))
        self.arrivals = [0.0] * B  # pipelines that asked for each block so far
        # Per block, for the one-pipeline unlock: its creation time, capacity, the dimension
        # unlock_step measures in (the first largest capacity) and the capacity there, as
        # Python numbers.
        self.created = instance.block_arrival.tolist()
        self.cap_rows = self.cap.tolist()
        self.top_dim = self.cap.argmax(axis=1).tolist()
        self.top = self.cap[np.arange(B), self.top_dim].tolist()
        #: False once a block has nothing locked (all zero): it stays so, only unlocks move locked budget.
        self.maybe_locked = [True] * B
        self.status = np.zeros(P, dtype=np.int8)
        self.grant_time = np.full(P, np.nan)
        self.edge_span, self.block_span = _spans(instance)
        edge_block = instance.edge_block.tolist()
        self.block_ids = [edge_block[edges] for edges in self.edge_span]  # (P,) lists of blocks
        self.deadline = instance.arrival + instance.timeout
        self.by_deadline = np.argsort(self.deadline, kind="stable")
        self.sorted_deadline = self.deadline[self.by_deadline].tolist()
        self.reserved: np.ndarray | None = None  # (E, K), once the policy sets budget aside
        self.reserving: bool | None = None  # unknown until the first pass
        self.rank: np.ndarray | None = None  # (P,) position in the policy's order, if per pipeline
        if shortcuts and orders_per_pipeline(spec.policy):
            self.rank = rank_everyone(instance, spec.policy)
            self.reserving = False  # a best-effort pass sets nothing aside
        self.watch = WatchLists(B, K, self.acc.is_rdp, self.live, self.status, PENDING)
        self.members: BlockMembers | None = None  # for policies that set budget aside
        self.carry = np.zeros(0, dtype=np.int64)
        self.pending = np.zeros(0, dtype=np.int64)  # pending pipelines, compacted lazily
        self.pending_upto = 0  # pipelines from here on are not yet in ``pending``
        self.deadline_next = 0  # position in ``by_deadline`` of the next timeout
        self.n_pending = 0
        self.passes = 0

    # -- budget -----------------------------------------------------------------------------

    def _unlock(self, blocks: np.ndarray, now: float) -> np.ndarray:
        """Raise ``blocks`` (distinct) to the unlock rule's target at ``now``, as the live
        scheduler does (:meth:`privsched.service.scheduler.Scheduler.unlock`); returns those
        that gained budget."""
        locked = self.locked[blocks]
        if not locked.any():  # fully unlocked already: nothing to raise
            return blocks[:0]
        elapsed = self._counted(now) - self.inst.block_arrival[blocks]
        target = unlocked_fraction(self.spec.unlock, np.array(self.arrivals)[blocks], elapsed)
        cap = self.cap[blocks]
        step = unlock_step(cap, locked, target)
        moved = unlock_amounts(cap, locked, step)
        self.locked[blocks] -= moved
        self.unlocked[blocks] += moved
        return blocks[step > 0]

    def _unlock_one(self, i: int, now: float) -> np.ndarray:
        """:meth:`_unlock` for pipeline i's few (distinct) blocks, block by block in Python
        floats with the same bits (:func:`~privsched.policies.unlock.block_unlock_step`).
        Blocks with nothing locked are skipped: they step by 0 and move nothing, and locked
        budget never comes back (:attr:`maybe_locked`)."""
        rule, counted = self.spec.unlock, self._counted(now)
        gained = []
        for j in self.block_ids[i]:
            if not self.maybe_locked[j]:
                continue
            row = self.locked[j].tolist()
            if not any(row):
                self.maybe_locked[j] = False
                continue
            target = block_unlocked_fraction(rule, self.arrivals[j], counted - self.created[j])
            locked = target >= 1.0 and any(x > 0 for x in row)  # the step reads it at a target of 1 only
            step = block_unlock_step(self.top[j], row[self.top_dim[j]], target, locked)
            moved = block_unlock_amounts(self.cap_rows[j], row, step)
            self.locked[j] -= moved
            self.unlocked[j] += moved
            if step > 0:
                gained.append(j)
        return np.array(gained, dtype=np.int64) if gained else _NO_BLOCKS

    def _counted(self, now: float) -> float:
        """The clock the unlock rule counts at ``now``: the latest grid instant, if per time."""
        return self.grid.floor(now) if self.grid is not None else now

    # -- candidates ----------------------------------------------------------------------------

    def _fitting(self, arrived: np.ndarray, dirty: list[np.ndarray]) -> np.ndarray:
        """Pending pipelines that fit now: among those that arrived, the watchers of blocks
        that gained budget, and those that still fitted after the last pass."""
        found = [a for a in (arrived, self.carry) if a.size]
        if dirty:
            blocks = self.watch.worth_scanning(_distinct(dirty), self.unlocked)
            for j in blocks.tolist():
                watchers = self.watch.may_fit(j, self.unlocked[j])
                if watchers.size:
                    found.append(watchers)
        if not found:
            return np.zeros(0, dtype=np.int64)
        candidates = found[0] if len(found) == 1 else np.unique(np.concatenate(found))
        return self._check(candidates[self.status[candidates] == PENDING])

    def _check(self, pipelines: np.ndarray) -> np.ndarray:
        """The pipelines whose whole demand fits the unlocked budget; each of the others
        watches the first of its blocks where it does not fit."""
        if len(pipelines) == 1:
            i = int(pipelines[0])
            edges, blocks = self.edge_span[i], self.block_span[i]
            demand = self.inst.edge_demand[edges]
            ok = fits(self.acc, demand, self.unlocked[blocks], self.live[blocks])
            if ok.all():
                return pipelines
            first = edges.start + int(np.argmin(ok))  # the first block where it does not fit
            witness = slice(first, first + 1)
            self.watch.watch(pipelines, self.inst.edge_block[witness], self.inst.edge_demand[witness])
            return pipelines[:0]
        if not len(pipelines):
            return pipelines
        edges, owner = self.inst.edges_of(pipelines)
        blocks = self.inst.edge_block[edges]
        demand = self.inst.edge_demand[edges]
        ok = fits(self.acc, demand, self.unlocked[blocks], self.live[blocks])
        if ok.all():
            return pipelines
        failing = np.flatnonzero(~ok)
        failing_owner = owner[failing]  # ascending: edges are grouped by pipeline
        first = np.flatnonzero(np.concatenate(([True], failing_owner[1:] != failing_owner[:-1])))
        losers, witness = failing_owner[first], failing[first]
        self.watch.watch(pipelines[losers], blocks[witness], demand[witness])
        keep = np.ones(len(pipelines), dtype=bool)
        keep[losers] = False
        return pipelines[keep]

    # -- events ---------------------------------------------------------------------------------

    def _arrive(self, first: int, last: int, now: float) -> np.ndarray | None:
        """Pipelines first..last-1 arrive (per-arrival unlock on their blocks); returns the
        (distinct) blocks that gained budget, if any."""
        self.status[first:last] = PENDING
        self.n_pending += last - first
        if not self.unlock_per_arrival > 0:
            return None
        if last - first > 1:
            blocks = self.inst.edge_block[self.edge_span[first].start : self.edge_span[last - 1].stop]
            touched = np.unique(blocks)
            for j, count in zip(touched.tolist(), np.bincount(blocks)[touched].tolist()):
                self.arrivals[j] += count
            gained = self._unlock(touched, now)
        else:
            for j in self.block_ids[first]:  # one pipeline: distinct blocks
                self.arrivals[j] += 1
            gained = self._unlock_one(first, now)
        return gained if gained.size else None

    def _expire(self, now: float) -> None:
        """Pending pipelines whose deadline is at or before ``now`` time out."""
        stop = bisect.bisect_right(self.sorted_deadline, now)
        if stop <= self.deadline_next:
            return
        due = self.by_deadline[self.deadline_next : stop]
        self.deadline_next = stop
        due = due[self.status[due] == PENDING]
        if not due.size:
            return
        self.status[due] = TIMED_OUT
        self.n_pending -= len(due)
        if self.reserved is not None:
            edges, _ = self.inst.edges_of(due)
            np.add.at(self.wasted, self.inst.edge_block[edges], self.reserved[edges])
            self.reserved[edges] = 0.0

    def _pending(self, upto: int) -> np.ndarray:
        """Every pending pipeline (all arrived before ``upto``), in arrival order."""
        pending = np.concatenate([self.pending, np.arange(self.pending_upto, upto)])
        self.pending = pending[self.status[pending] == PENDING]
        self.pending_upto = upto
        return self.pending

    # -- the allocation pass ---------------------------------------------------------------------

    def _pass(self, now: float, pipelines: np.ndarray) -> np.ndarray:
        """One call of the policy on ``pipelines`` (ascending); applies and returns the grants."""
        inst = self.inst
        snapshot, edges = inst.snapshot(pipelines, self.unlocked.copy(), now, self.reserved)
        if snapshot.reserved is None:
            snapshot = replace(snapshot, reserved=np.zeros((len(edges), self.acc.dims)))
        old = snapshot.reserved
        allocation: Allocation = self.spec.policy.allocate(snapshot)
        self.passes += 1
        if self.reserving is None:
            self.reserving = allocation.reserved is not None
        if self.reserving:
            if self.reserved is None:
                self.reserved = np.zeros((len(inst.edge_block), self.acc.dims))
            new = np.asarray(allocation.reserved, dtype=float)
            np.add.at(self.unlocked, inst.edge_block[edges], old - new)
            self.reserved[edges] = new
        granted = pipelines[np.asarray(allocation.granted, dtype=np.intp)]
        if granted.size:
            self._grant(now, granted)
        return granted

    def _grant(self, now: float, granted: np.ndarray, checked: bool = False) -> None:
        """Charge the granted pipelines' demands and mark them granted. Grants that do not
        come ``checked`` (from the policy) are verified: pending, and within capacity."""
        if not checked and (self.status[granted].min() != PENDING or np.unique(granted).size != granted.size):
            raise RuntimeError(f"policy {self.spec.name!r} granted a pipeline that is not pending")
        if len(granted) == 1:  # distinct blocks
            i = int(granted[0])
            edges, blocks = self.edge_span[i], self.block_span[i]
            demand = self.inst.edge_demand[edges]
            if not self.reserving:
                self.unlocked[blocks] -= demand
            self.consumed[blocks] += demand
        else:
            edges, _ = self.inst.edges_of(granted)
            blocks = self.inst.edge_block[edges]
            demand = self.inst.edge_demand[edges]
            if not self.reserving:
                np.subtract.at(self.unlocked, blocks, demand)
            np.add.at(self.consumed, blocks, demand)
        if self.reserving:
            self.reserved[edges] = 0.0  # the reservation was the demand: it is now consumed
        if not checked and not np.all(self.acc.is_safe(self.consumed[blocks], self.cap[blocks])):
            raise RuntimeError(f"policy {self.spec.name!r} granted more budget than a block holds")
        self.status[granted] = GRANTED
        self.grant_time[granted] = now
        self.n_pending -= granted.size

    def _allocate(self, now: float, arrived: np.ndarray, dirty: list[np.ndarray], upto: int) -> None:
        """The allocation pass of one instant (see the module docstring for what is skipped)."""
        if self.shortcuts and self.reserving:
            self._water_fill_pass(now, arrived, dirty)
            return
        if not self.shortcuts or self.reserving is None:
            if self.n_pending:
                self._pass(now, self._pending(upto))
                if self.shortcuts and self.reserving is False:  # the first pass told: start watching
                    self.carry = self._check(self._pending(upto))
                elif self.shortcuts:  # the policy sets budget aside: track who asks for each block
                    self.members = BlockMembers(self.inst.n_blocks, self.status, PENDING)
                    self._members_add(self._pending(upto))
            return
        fitting = self._fitting(arrived, dirty)
        self.carry = fitting[:0]
        if fitting.size == 0:
            return
        if self.rank is not None:
            self._ranked_pass(now, fitting)
            return
        if self._fit_together(fitting):
            # A best-effort pass in any order grants every pipeline that fits when the
            # fitting ones fit all together (in particular a lone one).
            self.passes += 1
            self._grant(now, fitting, checked=True)
            return
        granted = self._pass(now, self._pending(upto))
        self.carry = self._check(np.setdiff1d(fitting, granted, assume_unique=True))

    def _ranked_pass(self, now: float, fitting: np.ndarray) -> None:
        """The best-effort pass of a policy whose order is per pipeline, over the pipelines
        that fit (the others cannot be granted and do not change the order of the rest), in
        its order: the first one is granted, the rest are checked against what is left
        (those that no longer fit never will in this pass, and start watching), and so on.
        After a few grants the rest is walked at once."""
        self.passes += 1
        order = fitting[np.argsort(self.rank[fitting])] if len(fitting) > 1 else fitting
        for _ in range(GREEDY_GRANTS):
            self._grant(now, order[:1], checked=True)
            order = self._check(order[1:])
            if not order.size:
                return
        snapshot, _ = self.inst.snapshot(order, self.unlocked, now)
        walked = np.zeros(len(order), dtype=bool)
        walked[admit_in_order(snapshot, np.arange(len(order)))] = True
        self._grant(now, order[walked], checked=True)
        self._check(order[~walked])

    def _members_add(self, pipelines: np.ndarray) -> None:
        edges, owner = self.inst.edges_of(pipelines)
        self.members.add(pipelines[owner], self.inst.edge_block[edges])

    def _water_fill_pass(self, now: float, arrived: np.ndarray, dirty: list[np.ndarray]) -> None:
        """A pass of a policy that sets budget aside, over the pipelines it can change: those
        that arrived and those asking for a block that gained budget. After a water-filling
        pass every other block has nothing left to give, or nobody left to fill."""
        self._members_add(arrived)
        found = [arrived] + [self.members.of(j) for j in (_distinct(dirty).tolist() if dirty else [])]
        pipelines = np.unique(np.concatenate(found))
        pipelines = pipelines[self.status[pipelines] == PENDING]
        if pipelines.size:
            self._pass(now, pipelines)

    def _fit_together(self, pipelines: np.ndarray) -> bool:
        """Whether the pipelines' summed demands fit the unlocked budget on every block."""
        if len(pipelines) == 1:
            return True
        edges, _ = self.inst.edges_of(pipelines)
        blocks = self.inst.edge_block[edges]
        total = np.zeros_like(self.unlocked)
        np.add.at(total, blocks, self.inst.edge_demand[edges])
        touched = np.unique(blocks)
        return bool(np.all(fits(self.acc, total[touched], self.unlocked[touched], self.live[touched])))

    # -- the event loop ---------------------------------------------------------------------------

    def run(self) -> RunState:
        """Simulate the whole workload: visit every instant at which something happens
        (block or pipeline arrival, unlock grid instant) in time order, apply its events and
        one allocation pass (module docstring; docs/design.md §4.3, §6.4), until nothing can
        change. Pipelines with a deadline still pending at the end time out. Returns each
        pipeline's outcome and grant time and each block's budget."""
        inst = self.inst
        B, P = inst.n_blocks, inst.n_pipelines
        at_creation = self.spec.unlock.on_block_created()
        horizon = self._horizon()
        sample_times = np.linspace(0.0, horizon, self.samples) if self.samples else np.zeros(0)
        sampled: list[np.ndarray] = []
        block_times, arrival_times = inst.block_arrival.tolist(), inst.arrival.tolist()
        b_next = p_next = 0
        ticks = 1  # index of the next instant of the unlock grid
        now = 0.0
        while True:
            t_block = block_times[b_next] if b_next < B else math.inf
            t_pipe = arrival_times[p_next] if p_next < P else math.inf
            t_tick = math.inf
            if self.grid is not None and (self.n_pending or p_next < P) and (b_next < B or np.any(self.locked[:b_next] > 0)):
                t_tick = self.grid.instant(ticks)
            now = min(t_block, t_pipe, t_tick)
            if now == math.inf:
                break
            while len(sampled) < len(sample_times) and sample_times[len(sampled)] < now:
                sampled.append(self.consumed.copy())
            dirty: list[np.ndarray] = []
            # 1. block arrivals
            b_stop = bisect.bisect_right(block_times, now)
            if b_stop > b_next:
                created = np.arange(b_next, b_stop)
                if at_creation > 0:
                    self._unlock(created, now)
                b_next = b_stop
            # 2. per-time unlock (catching up on ticks skipped while nothing could use them)
            if self.grid is not None and now >= self.grid.instant(ticks):
                raised = self._unlock(np.arange(b_next), now)
                if raised.size:
                    dirty.append(raised)
                ticks = self.grid.index(now) + 1
            # 3. pipeline arrivals
            p_stop = bisect.bisect_right(arrival_times, now)
            arrived = np.arange(p_next, p_stop)
            if p_stop > p_next:
                gained = self._arrive(p_next, p_stop, now)
                if gained is not None:
                    dirty.append(gained)
                p_next = p_stop
            # 4. timeouts
            self._expire(now)
            # 5. one allocation pass
            self._allocate(now, arrived, dirty, p_next)
        self._expire(sys.float_info.max)  # every finite deadline passes; no timeout: still pending
        while len(sampled) < len(sample_times):
            sampled.append(self.consumed.copy())
        return RunState(
            status=self.status,
            grant_time=self.grant_time,
            consumed=self.consumed,
            wasted=self.wasted,
            sample_times=sample_times,
            sample_consumed=np.array(sampled).reshape(len(sample_times), B, self.acc.dims),
            passes=self.passes,
        )

    def _horizon(self) -> float:
        """The time by which every pipeline with a timeout has been settled."""
        ends = [self.inst.block_arrival.max(initial=0.0), self.inst.arrival.max(initial=0.0)]
        finite = self.deadline[np.isfinite(self.deadline)]
        ends.append(finite.max(initial=0.0))
        return float(max(ends))


def _distinct(arrays: list[np.ndarray]) -> np.ndarray:
    """The distinct entries of a non-empty list of arrays that each hold distinct entries."""
    return arrays[0] if len(arrays) == 1 else np.unique(np.concatenate(arrays))


def _spans(instance: Instance) -> tuple[list[slice], list[slice | np.ndarray]]:
    """Per pipeline, its edges as a slice, and its blocks as a slice when they are consecutive
    and ascending (views instead of gathers for the one-pipeline paths), else as an array."""
    starts = instance.edge_start.tolist()
    block = instance.edge_block.tolist()
    # breaks[e]: how many steps between edges 0..e are not to the next block
    breaks = np.concatenate(([0], np.cumsum(np.diff(instance.edge_block) != 1))).tolist()
    edges, blocks = [], []
    for a, b in zip(starts[:-1], starts[1:]):
        edges.append(slice(a, b))
        consecutive = b > a and breaks[b - 1] == breaks[a]
        blocks.append(slice(block[a], block[a] + b - a) if consecutive else instance.edge_block[a:b])
    return edges, blocks
