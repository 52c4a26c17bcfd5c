"""The discrete-event simulator: the scheduler's semantics without waiting (docs/design.md §4.1, §4.3).

At every instant the events are applied in the order block arrivals, unlocks (per-time
ticks), pipeline arrivals (with their per-arrival unlocks), timeouts; then one allocation
pass calls ``spec.policy.allocate(snapshot)``, the very code the live scheduler calls.
Unlocking raises each block to the fraction the live scheduler computes too
(:func:`~privsched.policies.unlock.unlocked_fraction`), per-time rules on the grid
``first block arrival + k · tick`` (:attr:`Simulator.grid`). A lone arriving pipeline's
blocks are raised one by one in Python floats with the same bits (the ``block_*`` twins in
:mod:`privsched.policies.unlock`), skipping blocks with nothing left locked.

Which passes run, and over which pipelines, is the job of :mod:`.skipping`: with
``shortcuts`` (the default) a pass that provably grants nothing is skipped and others look
only at the pipelines that fit; ``shortcuts=False`` runs one full pass at every instant.
Timeouts are applied before each pass rather than at instants of their own: a timeout
alone never enables a grant.
"""

from __future__ import annotations

import bisect
import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from privsched.budgets.exact import clamp, raised_of, raised_units, sum_at, units, value
from privsched.policies.admission import charge
from privsched.policies.base import Allocation, PolicySpec
from privsched.policies.unlock import (
    UnlockGrid,
    block_unlocked_fraction,
    unlocked_fraction,
)
from privsched.simulation.instance import Instance
from privsched.simulation.skipping import EveryInstant, PassSkipping
from privsched.simulation.status import GRANTED, PENDING, TIMED_OUT

#: Default per-time unlock period: 1 s, clipped so that a block unlocks in 10 to 100 ticks.
DEFAULT_TICK, MIN_TICKS, MAX_TICKS = 1.0, 10, 100

_NO_BLOCKS = np.zeros(0, dtype=np.int64)


@dataclass
class RunState:
    """What a finished run leaves: per-pipeline outcome and per-block budget."""

    status: np.ndarray  # (P,) codes, see STATUS_NAMES
    grant_time: np.ndarray  # (P,) nan unless granted
    consumed: np.ndarray  # (B, K) granted budget (the simulator's jobs spend all they get)
    fraction: np.ndarray  # (P,) fraction of its demand each pipeline was granted, nan unless granted
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
            lifetime = 1.0 / float(spec.unlock.on_tick(1.0))
            tick = min(max(DEFAULT_TICK, lifetime / MAX_TICKS), lifetime / MIN_TICKS)
        if tick is not None and not (tick > 0 and math.isfinite(tick)):
            raise ValueError(f"tick must be a positive number of seconds, got {tick!r}")
        self.tick = tick if per_time else None
        self.samples = samples
        self.unlock_per_arrival = spec.unlock.on_pipeline_arrival()
        #: The instants of per-time unlocking (None for the other rules).
        self.grid = UnlockGrid(float(instance.block_arrival[0]), self.tick) if self.tick and instance.n_blocks else None

        B, K, P = instance.n_blocks, self.acc.dims, instance.n_pipelines
        self.cap = instance.capacity
        self.live = self.acc.live(self.cap)
        # Balances in exact quanta (docs/design.md §3.3), the ledger's arithmetic.
        self.cap_units = units(self.cap, up=False)
        self.locked = self.cap_units.copy()
        self.unlocked = np.zeros((B, K), dtype=np.int64)
        self.consumed = np.zeros((B, K), dtype=np.int64)
        self.demand = units(instance.edge_demand, up=True)  # (E, K) quanta
        #: (E, K) quanta of each edge's minimum, what a pipeline needs to be granted (its
        #: whole demand unless elastic, docs/design.md §4.2).
        self.minimum = self.demand
        if instance.is_elastic and instance.elastic_min is not None:
            self.minimum = charge(instance.edge_demand, instance.elastic_min[instance.edge_pipeline][:, None])
        self.fraction = np.full(P, np.nan)
        self.wasted = np.zeros((B, K))
        self.arrivals = [0.0] * B  # pipelines that asked for each block so far
        # Per block, for the one-pipeline unlock: its creation time and capacity (also in
        # quanta) as Python numbers.
        self.created = instance.block_arrival.tolist()
        self.cap_rows = self.cap.tolist()
        self.cap_unit_rows = self.cap_units.tolist()
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
        self.pending_list = np.zeros(0, dtype=np.int64)  # pending pipelines, compacted lazily
        self.pending_upto = 0  # pipelines from here on are not yet in ``pending``
        self.deadline_next = 0  # position in ``by_deadline`` of the next timeout
        self.n_pending = 0
        self.passes = 0
        #: What each team holds on each block (T, B, K), under team quotas.
        self.held = np.zeros((len(instance.share), B, K), dtype=np.int64) if instance.has_quotas and instance.share is not None else None
        #: Decides which passes run and over which pipelines. Under quotas a pipeline's fit
        #: also depends on its team's holdings, which the shortcuts do not follow: every pass runs.
        self.allocation = PassSkipping(self) if shortcuts and self.held is None else EveryInstant(self)

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
        moved = raised_units(self.cap[blocks], self.cap_units[blocks], locked, target)
        self.locked[blocks] = locked - moved
        self.unlocked[blocks] += moved
        return blocks[(moved > 0).any(axis=1)]

    def _unlock_one(self, i: int, now: float) -> np.ndarray:
        """:meth:`_unlock` for pipeline i's few (distinct) blocks, block by block in Python
        numbers with the same result (:func:`~privsched.policies.unlock.block_unlocked_fraction`,
        :func:`~privsched.budgets.exact.raised_of`).
        Blocks with nothing locked are skipped: they move nothing, and locked budget never
        comes back (:attr:`maybe_locked`)."""
        rule, counted = self.spec.unlock, self._counted(now)
        gained = []
        for j in self.block_ids[i]:
            if not self.maybe_locked[j]:
                continue
            if not (self.locked[j] > 0).any():
                self.maybe_locked[j] = False
                continue
            target = block_unlocked_fraction(rule, self.arrivals[j], counted - self.created[j])
            moved = raised_of(self.cap_rows[j], self.cap_unit_rows[j], self.locked[j].tolist(), target)
            if any(moved):
                self.locked[j] -= moved
                self.unlocked[j] += moved
                gained.append(j)
        return np.array(gained, dtype=np.int64) if gained else _NO_BLOCKS

    def _counted(self, now: float) -> float:
        """The clock the unlock rule counts at ``now``: the latest grid instant, if per time."""
        return self.grid.floor(now) if self.grid is not None else now

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

    def pending(self, upto: int) -> np.ndarray:
        """Every pending pipeline (all arrived before ``upto``), in arrival order."""
        pending = np.concatenate([self.pending_list, np.arange(self.pending_upto, upto)])
        self.pending_list = pending[self.status[pending] == PENDING]
        self.pending_upto = upto
        return self.pending_list

    # -- the allocation pass ---------------------------------------------------------------------

    def full_pass(self, now: float, pipelines: np.ndarray) -> np.ndarray:
        """One call of the policy on ``pipelines`` (ascending); applies and returns the grants."""
        inst = self.inst
        held = None if self.held is None else value(self.held)
        snapshot, edges = inst.snapshot(pipelines, value(self.unlocked), now, self.reserved, held)
        old = snapshot.reserved
        if old is None:
            old = np.zeros((len(edges), self.acc.dims))
            snapshot = replace(snapshot, reserved=old)
        allocation: Allocation = self.spec.policy.allocate(snapshot)
        self.passes += 1
        if self.reserving is None:
            self.reserving = allocation.reserved is not None
        if self.reserving:
            if self.reserved is None:
                self.reserved = np.zeros((len(inst.edge_block), self.acc.dims))
            new = np.asarray(allocation.reserved, dtype=float)
            np.add.at(self.unlocked, inst.edge_block[edges], units(old, up=True) - units(new, up=True))
            self.reserved[edges] = new
        granted = pipelines[np.asarray(allocation.granted, dtype=np.intp)]
        if granted.size:
            self.grant(now, granted, fraction=allocation.fraction)
        return granted

    def grant(self, now: float, granted: np.ndarray, checked: bool = False, fraction: np.ndarray | None = None) -> None:
        """Charge the granted pipelines ``fraction`` of their demands (None: all of them) and
        mark them granted. Grants that do not come ``checked`` (from the policy) are
        verified: pending, each fraction within its pipeline's range, and within capacity."""
        if not checked and (self.status[granted].min() != PENDING or np.unique(granted).size != granted.size):
            raise RuntimeError(f"policy {self.spec.name!r} granted a pipeline that is not pending")
        edges: slice | np.ndarray
        partial = fraction is not None and bool(np.any(np.asarray(fraction) < 1))
        if partial and not checked:
            self._check_fractions(granted, np.asarray(fraction, dtype=float))
        self.fraction[granted] = 1.0 if fraction is None else fraction
        if len(granted) == 1:  # distinct blocks
            i = int(granted[0])
            edges, blocks = self.edge_span[i], self.block_span[i]
            demand = charge(self.inst.edge_demand[edges], float(self.fraction[i])) if partial else self.demand[edges]
            if not self.reserving:
                self.unlocked[blocks] = clamp(self.unlocked[blocks] - demand)
            self.consumed[blocks] = clamp(self.consumed[blocks] + demand)
        else:
            edges, owner = self.inst.edges_of(granted)
            blocks = self.inst.edge_block[edges]
            demand = charge(self.inst.edge_demand[edges], self.fraction[granted][owner][:, None]) if partial else self.demand[edges]
            total = sum_at(self.inst.n_blocks, blocks, demand)
            touched = np.unique(blocks)
            if not self.reserving:
                self.unlocked[touched] = clamp(self.unlocked[touched] - total[touched])
            self.consumed[touched] = clamp(self.consumed[touched] + total[touched])
        if self.held is not None:
            self._hold(granted)
        if self.reserving and self.reserved is not None:
            self.reserved[edges] = 0.0  # the reservation was the demand: it is now consumed
        if not checked and not np.all(self.acc.fits_units(self.consumed[blocks], self.cap_units[blocks], self.live[blocks])):
            raise RuntimeError(f"policy {self.spec.name!r} granted more budget than a block holds")
        self.status[granted] = GRANTED
        self.grant_time[granted] = now
        self.n_pending -= granted.size

    def _check_fractions(self, granted: np.ndarray, fraction: np.ndarray) -> None:
        """Refuse a policy's fractions unless there is one per grant, each in its pipeline's
        range ``[elastic_min, 1]``."""
        low = np.ones(len(granted)) if self.inst.elastic_min is None else self.inst.elastic_min[granted]
        if fraction.shape != granted.shape or not np.all((fraction >= low) & (fraction <= 1)):
            raise RuntimeError(f"policy {self.spec.name!r} granted a fraction outside a pipeline's range")

    def _hold(self, granted: np.ndarray) -> None:
        """Count the granted pipelines' demands as held by their teams (under quotas; a
        simulated pipeline consumes its grant, so a team never holds less)."""
        assert self.held is not None and self.inst.team is not None
        under = granted[self.inst.team[granted] >= 0]
        if not under.size:
            return
        edges, owner = self.inst.edges_of(under)
        n_blocks = self.inst.n_blocks
        cell = self.inst.team[under][owner] * n_blocks + self.inst.edge_block[edges]
        flat = self.held.reshape(-1, self.acc.dims)
        share = self.fraction[under][owner]
        rows = self.demand[edges] if np.all(share == 1) else charge(self.inst.edge_demand[edges], share[:, None])
        total = sum_at(len(flat), cell, rows)
        touched = np.unique(cell)
        flat[touched] = clamp(flat[touched] + total[touched])

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
                sampled.append(value(self.consumed))
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
            self.allocation.allocate(now, arrived, dirty, p_next)
        self._expire(sys.float_info.max)  # every finite deadline passes; no timeout: still pending
        while len(sampled) < len(sample_times):
            sampled.append(value(self.consumed))
        return RunState(
            status=self.status,
            grant_time=self.grant_time,
            consumed=value(self.consumed),
            fraction=self.fraction,
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
