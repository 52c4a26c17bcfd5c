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

Budgets are walked in exact quanta (:mod:`privsched.budgets.exact`), the ledger's own
arithmetic, so that the walk never grants what the ledger then refuses for rounding. A
team's quota (:class:`~privsched.policies.base.Quotas`) is one more block per team and
block: its budget is what the team may still take there, and each edge of one of the
team's pipelines has a twin on it, so that the walk skips what a quota holds back and
goes on to the next pipeline.

Elastic demands (``Snapshot.elastic_min``; docs/design.md §4.2, elastic demands): the walk
decides who is granted on every pipeline's minimum (:func:`at_minimum`), then each granted
pipeline is topped up in grant order to the largest fraction of its demand that fits what
is left, up to a fair share when the policy has one (:func:`top_up`, one pipeline at a time:
they are the few granted, not the many walked). With no elastic pipeline, :func:`admit` is
exactly the vectorised walk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.exact import LIMIT, SCALE, clamp, sum_at, units
from privsched.policies.base import Allocation, Snapshot


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
    quotas = snapshot.quotas
    if quotas is not None:
        teams = len(quotas.share)
        if np.shape(quotas.team) != (n,) or np.shape(quotas.held) != (teams, n_blocks, dims):
            raise ValueError(f"quotas need one team per pending pipeline and holdings of shape (teams, blocks, {dims})")
        if n and (np.min(quotas.team) < -1 or np.max(quotas.team) >= teams):
            raise ValueError("a pipeline's team is not among the quotas' teams")
        if teams and not (np.all(np.asarray(quotas.share) >= 0) and np.all(np.asarray(quotas.share) <= 1)):
            raise ValueError("quota shares must be in [0, 1]")
    elastic = snapshot.elastic_min
    if elastic is not None:
        if np.shape(elastic) != (n,):
            raise ValueError("elastic_min needs one entry per pending pipeline")
        if not np.all((np.asarray(elastic, dtype=float) > 0) & (np.asarray(elastic, dtype=float) <= 1)):
            raise ValueError("elastic_min must be in (0, 1]")


def validate_allocation(snapshot: Snapshot, allocation: Allocation) -> None:
    """Raise ValueError (one line) unless ``allocation`` grants distinct pending pipelines,
    each a fraction within its range ``[elastic_min, 1]``."""
    granted = np.asarray(allocation.granted)
    n = snapshot.n_pipelines
    if granted.ndim != 1 or (granted.size and (granted.min() < 0 or granted.max() >= n)):
        raise ValueError("an allocation grants a pipeline that is not in the snapshot")
    if len(np.unique(granted)) != len(granted):
        raise ValueError("an allocation grants a pipeline twice")
    if allocation.fraction is None:
        return
    fraction = np.asarray(allocation.fraction, dtype=float)
    if fraction.shape != granted.shape:
        raise ValueError("an allocation's fraction needs one entry per granted pipeline")
    low = np.ones(n) if snapshot.elastic_min is None else np.asarray(snapshot.elastic_min, dtype=float)
    if not np.all((fraction >= low[granted]) & (fraction <= 1)):
        raise ValueError("a granted fraction is outside its pipeline's range [elastic_min, 1]")


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
    given_quanta: np.ndarray | None = None  # (E, K) ``demand`` in quanta if known (see ``quanta``)

    @property
    def quanta(self) -> np.ndarray:
        """(E, K) int64: ``demand`` in exact quanta, rounded up (computed on first use: an
        ordering such as DPF's needs only the demands)."""
        if self.given_quanta is None:
            object.__setattr__(self, "given_quanta", units(self.demand, up=True))
        assert self.given_quanta is not None
        return self.given_quanta

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

    @classmethod
    def admitting(cls, snapshot: Snapshot, available: np.ndarray | None = None) -> tuple[EdgeTable, np.ndarray]:
        """The table an admission pass walks, and its budgets in quanta: the snapshot's
        blocks (``available``, else its unlocked budget), then, under team quotas, one block
        per team and block whose budget is the team's room there (module docstring)."""
        table = cls.of(snapshot)
        budget = units(snapshot.unlocked if available is None else available, up=False)
        quotas = snapshot.quotas
        if quotas is None or not np.any(np.asarray(quotas.team) >= 0):
            return table, budget
        n_blocks = table.n_blocks
        team = np.asarray(quotas.team, dtype=np.intp)
        pipeline = np.repeat(np.arange(snapshot.n_pipelines), table.count)
        twins = np.flatnonzero(team[pipeline] >= 0)
        edges = np.concatenate([np.arange(len(pipeline)), twins])
        owner = np.concatenate([pipeline, pipeline[twins]])
        blocks = np.concatenate([table.block, n_blocks * (1 + team[pipeline[twins]]) + table.block[twins]])
        order = np.argsort(owner, kind="stable")  # grouped by pipeline again, twins after their blocks
        count = np.bincount(owner, minlength=snapshot.n_pipelines)
        room = quotas.room(np.asarray(snapshot.capacity, dtype=float)).reshape(-1, table.live.shape[1])
        augmented = cls(
            accounting=table.accounting,
            start=np.cumsum(count) - count,
            count=count,
            block=blocks[order],
            demand=table.demand[edges[order]],
            live=np.concatenate([table.live, np.tile(table.live, (len(quotas.share), 1))]),
            given_quanta=table.quanta[edges[order]],
        )
        return augmented, np.concatenate([budget, room])

    @property
    def n_blocks(self) -> int:
        return self.live.shape[0]

    def gather(self, pipelines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Edges of ``pipelines`` in their order, and each edge's position in ``pipelines``."""
        return spans(self.start[pipelines], self.count[pipelines])

    def fits_alone(self, available: np.ndarray, pipelines: np.ndarray) -> np.ndarray:
        """Whether each pipeline's whole demand fits ``available`` (B, K quanta) on its own."""
        edges, owner = self.gather(pipelines)
        blocks = self.block[edges]
        ok = self.accounting.fits_units(self.quanta[edges], available[blocks], self.live[blocks])
        return np.bincount(owner[~ok], minlength=len(pipelines)) == 0

    def charge(self, available: np.ndarray, pipelines: np.ndarray) -> np.ndarray:
        """``available`` (quanta) minus the whole demand of ``pipelines``."""
        edges, _ = self.gather(np.asarray(pipelines, dtype=np.intp))
        return self.subtract(available, self.block[edges], self.quanta[edges])

    @staticmethod
    def subtract(available: np.ndarray, blocks: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """``available`` minus each row of ``demand`` on its block, in exact quanta. A row
        larger than what its block has left counts as that plus one quantum: the block is
        short there either way."""
        left = np.array(available, dtype=np.int64)
        cap = np.maximum(left[blocks], -1) + 1
        return clamp(left - sum_at(len(left), blocks, np.minimum(demand, cap)))

    def walk(self, available: np.ndarray, order: np.ndarray) -> np.ndarray:
        """The best-effort pass over ``order`` from ``available`` (B, K quanta): a granted
        mask over ``order``."""
        order = np.asarray(order, dtype=np.intp)
        n = len(order)
        granted = np.zeros(n, dtype=bool)
        alive = np.ones(n, dtype=bool)
        available = np.array(available, dtype=np.int64)
        edges, owner = self.gather(order)
        by_block = np.argsort(self.block[edges], kind="stable")  # keeps the walk order per block
        owner, demand = owner[by_block], self.quanta[edges[by_block]]
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
        the block's rows up to it), in exact quanta. Worked through in slices of whole blocks
        so that the (rows, K) temporaries stay small."""
        ok = np.empty(len(rows), dtype=bool)
        for part in _slices(blocks):
            part_blocks = blocks[part]
            wanted = demand[rows[part]]
            budget, live = available[part_blocks], self.live[part_blocks]
            if not cumulative:
                ok[part] = self.accounting.fits_units(wanted, budget, live)
                continue
            # A row above its block's budget fails there whatever it is: counted as budget + 1,
            # the running totals of a block stay below 2⁶³ (else summed as Python integers).
            wanted = np.minimum(wanted, np.maximum(budget, -1) + 1)
            first, group = _groups(part_blocks)
            totals = _running_totals(wanted, first, group)
            ok[part] = self.accounting.fits_units(totals, budget, live)
        return ok


def _running_totals(rows: np.ndarray, first: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per run of rows (``first``, ``group``: :func:`_groups`), the running sum of its rows
    up to each row, exact: in int64 when no total can reach 2⁶², else as Python integers
    clipped to :data:`~privsched.budgets.exact.LIMIT`."""
    if len(rows) == 0:
        return rows
    if int(np.abs(rows).max()) * len(rows) < 2**62:
        running = np.cumsum(rows, axis=0)
        before = np.vstack([np.zeros((1, rows.shape[1]), dtype=np.int64), running[first[1:] - 1]])
        return running - before[group]
    running = np.cumsum(rows.astype(object), axis=0)
    before = np.vstack([np.zeros((1, rows.shape[1]), dtype=object), running[first[1:] - 1]])
    return np.clip(running - before[group], -LIMIT, LIMIT).astype(np.int64)


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


def is_elastic(snapshot: Snapshot) -> bool:
    """Whether some pending pipeline of the snapshot accepts less than its whole demand."""
    return snapshot.elastic_min is not None and bool(np.any(np.asarray(snapshot.elastic_min) < 1))


def charge(demand: np.ndarray, fraction: float | np.ndarray) -> np.ndarray:
    """What a grant of ``fraction`` of ``demand`` is charged, in exact quanta: the float
    product ``fraction × demand`` (every order alike), rounded up as any demand is
    (docs/design.md §4.2, elastic demands)."""
    return units(np.asarray(demand, dtype=float) * fraction, up=True)


def at_minimum(snapshot: Snapshot) -> Snapshot:
    """The snapshot with every pipeline asking for its minimum, ``elastic_min × edge_demand``,
    as a fixed demand: what the policies decide *who* is granted on."""
    if snapshot.elastic_min is None:
        return snapshot
    validate(snapshot)
    low = np.asarray(snapshot.elastic_min, dtype=float)[np.asarray(snapshot.edge_pipeline, dtype=np.intp)]
    demand = np.asarray(snapshot.edge_demand, dtype=float) * low[:, None]
    return replace(snapshot, edge_demand=demand, elastic_min=None)


def edge_shares(snapshot: Snapshot, table: EdgeTable) -> np.ndarray:
    """(E, K) each edge's demand as a share of its block's capacity, per dimension
    (:meth:`~privsched.budgets.accounting.Accounting.shares`), in small slices."""
    shares = np.empty_like(table.demand)
    for start in range(0, len(shares), SLICE_ROWS):  # small temporaries, see EdgeTable._fit_rows
        part = slice(start, start + SLICE_ROWS)
        shares[part] = snapshot.accounting.shares(table.demand[part], snapshot.capacity[table.block[part]])
    return shares


def dominant_shares(table: EdgeTable, shares: np.ndarray) -> np.ndarray:
    """(P,) each pipeline's dominant share, the largest of its :func:`edge_shares` (Luo et
    al., OSDI'21 §4.1); 0 for a pipeline that asks for nothing."""
    dominant = np.zeros(len(table.count))
    requesting = np.flatnonzero(table.count)
    if requesting.size:
        dominant[requesting] = np.maximum.reduceat(shares.max(axis=1, initial=0.0), table.start[requesting])
    return dominant


def top_up(snapshot: Snapshot, granted: np.ndarray, fair_share: float | None = None) -> np.ndarray:
    """The fraction of its edge demands each of ``granted`` receives (docs/design.md §4.2,
    elastic demands): every granted pipeline's minimum is charged first; then, in grant
    order, each one takes the largest fraction in ``[elastic_min, ceiling]`` whose charge
    fits what is left on every one of its blocks (and its team's quota), at some live order
    under RDP, in exact quanta. The ceiling is 1, or with a ``fair_share`` (DPF-N's 1/N) the
    fraction at which the pipeline's dominant share reaches the fair share, if that is less
    (never below the minimum). ``granted`` must fit at its minimums, as a walk of
    :func:`at_minimum` grants."""
    granted = np.asarray(granted, dtype=np.intp)
    fraction = np.ones(len(granted))
    if not is_elastic(snapshot) or not len(granted):
        return fraction
    assert snapshot.elastic_min is not None
    low = np.asarray(snapshot.elastic_min, dtype=float)[granted]
    high = np.ones(len(granted))
    if fair_share is not None:
        base = EdgeTable.of(snapshot)
        dominant = dominant_shares(base, edge_shares(snapshot, base))[granted]
        with np.errstate(divide="ignore"):
            high = np.maximum(low, np.minimum(1.0, fair_share / dominant))
    table, budget = EdgeTable.admitting(snapshot)
    edges, owner = table.gather(granted)
    minimum = charge(table.demand[edges], low[owner][:, None])
    available = EdgeTable.subtract(budget, table.block[edges], minimum)
    first = np.cumsum(table.count[granted]) - table.count[granted]  # each one's rows of ``edges``
    for position in np.flatnonzero(low < high).tolist():
        rows = slice(int(first[position]), int(first[position] + table.count[granted[position]]))
        blocks, demand = table.block[edges[rows]], table.demand[edges[rows]]
        room = available[blocks] + minimum[rows]  # what it may take, its own minimum given back
        f = _largest_fraction(table.accounting, demand, room, table.live[blocks], float(low[position]), float(high[position]))
        available[blocks] = clamp(room - charge(demand, f))
        fraction[position] = f
    fraction[low >= high] = low[low >= high]
    return fraction


def _largest_fraction(accounting: Accounting, demand: np.ndarray, room: np.ndarray, live: np.ndarray, low: float, high: float) -> float:
    """The largest f in [low, high] whose charge ``f × demand`` fits ``room`` (quanta) on every
    row, given that ``low`` fits: the real-valued bound, then bisection where rounding to
    quanta makes it miss."""

    def fits(f: float) -> bool:
        return bool(np.all(accounting.fits_units(charge(demand, f), room, live)))

    if fits(high):
        return high
    scaled = demand * SCALE  # the demand in (real-valued) quanta
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scaled > 0, room / np.where(scaled > 0, scaled, 1.0), np.where(room >= 0, np.inf, -np.inf))
    if accounting.is_rdp:
        per_row = np.max(np.where(live, ratio, -np.inf), axis=1)
    else:
        per_row = np.min(ratio, axis=1)
    best = min(high, float(per_row.min(initial=np.inf)))
    if best <= low:
        return low
    if fits(best):
        return best
    lo, hi = low, best
    for _ in range(60):
        middle = (lo + hi) / 2
        if middle in (lo, hi):
            break
        lo, hi = (middle, hi) if fits(middle) else (lo, middle)
    return lo


def admit(snapshot: Snapshot, order: np.ndarray, fair_share: float | None = None) -> Allocation:
    """The best-effort pass over ``order`` (:func:`admit_in_order`) with elastic demands:
    *who* is granted is decided on the minimums, then each granted pipeline is topped up in
    the same order, up to its ``fair_share`` if given (:func:`top_up`). Without elastic
    demands, exactly :func:`admit_in_order`."""
    if not is_elastic(snapshot):
        return Allocation(granted=admit_in_order(snapshot, order))
    granted = admit_in_order(at_minimum(snapshot), order)
    return Allocation(granted=granted, fraction=top_up(snapshot, granted, fair_share))


def admit_in_order(snapshot: Snapshot, order: np.ndarray) -> np.ndarray:
    """Grant, in ``order``, every pipeline that fits when its turn comes, and its team's
    quota (docs/design.md §4.2).

    Returns the granted pipeline indices in grant order.
    """
    order = np.asarray(order, dtype=np.intp)
    table, available = EdgeTable.admitting(snapshot)
    return order[table.walk(available, order)]
