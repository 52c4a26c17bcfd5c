"""Unlock rules: how a block's locked budget becomes available to the scheduler.

docs/design.md §4.1, after Luo et al., OSDI'21 §4.1 ("DPF-N" and "DPF-T"): budget is released
gradually so that early pipelines cannot drain a block before later ones arrive. Each rule
only returns fractions of capacity; callers raise each block's unlocked budget to
``⌊fraction × capacity⌋`` at every dimension (the same fraction at every RDP order), in
exact quanta (:func:`~privsched.budgets.exact.raised`).

:func:`unlocked_fraction` and :func:`unlock_amounts` are the one unlock computation: the live
scheduler (:meth:`privsched.service.scheduler.Scheduler.unlock`) and the simulator
(:class:`privsched.simulation.engine.Simulator`) both raise each block's unlocked fraction
to the rule's target with them, per-time unlocking happening on the instants of an
:class:`UnlockGrid`. :func:`earliest_fit_time` and :func:`arrivals_to_fit` answer, on those same
functions, when a waiting demand will fit: the earliest time under a per-time rule, the
fewest further arrivals under a per-arrival one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.exact import plus, raised

if TYPE_CHECKING:
    from privsched.policies.base import UnlockRule


@dataclass(frozen=True)
class UnlockAll:
    """A block is fully unlocked when it is created (FCFS's rule)."""

    name: ClassVar[str] = "all"

    def on_block_created(self) -> float:
        return 1.0

    def on_pipeline_arrival(self) -> float:
        return 0.0

    def on_tick(self, elapsed: float | np.ndarray) -> float:
        return 0.0


@dataclass(frozen=True)
class UnlockPerArrival:
    """Each arriving pipeline unlocks ``capacity / n`` on every block it demands.

    The first ``n`` pipelines on a block are each guaranteed a fair share ``capacity / n``.
    """

    n: int
    name: ClassVar[str] = "n"

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive integer, got {self.n!r}")

    def on_block_created(self) -> float:
        return 0.0

    def on_pipeline_arrival(self) -> float:
        return 1.0 / self.n

    def on_tick(self, elapsed: float | np.ndarray) -> float:
        return 0.0


@dataclass(frozen=True)
class UnlockPerTime:
    """Every block unlocks ``capacity × elapsed / lifetime`` as the clock advances.

    A block is fully unlocked ``lifetime`` seconds after its creation.
    """

    lifetime: float
    name: ClassVar[str] = "t"

    def __post_init__(self) -> None:
        ok = isinstance(self.lifetime, (int, float)) and not isinstance(self.lifetime, bool)
        if not ok or not math.isfinite(self.lifetime) or self.lifetime <= 0:
            raise ValueError(f"lifetime must be a positive number of seconds, got {self.lifetime!r}")

    def on_block_created(self) -> float:
        return 0.0

    def on_pipeline_arrival(self) -> float:
        return 0.0

    def on_tick(self, elapsed: float | np.ndarray) -> float | np.ndarray:
        if np.any(np.asarray(elapsed) < 0):
            raise ValueError(f"elapsed time must be non-negative, got {elapsed!r}")
        return elapsed / self.lifetime


@dataclass(frozen=True)
class UnlockGrid:
    """The instants ``origin + k·period`` (k = 0, 1, …) at which per-time unlocking happens.

    Between two instants of the grid a per-time rule unlocks nothing more: at clock ``now``
    a block created at ``c`` counts ``max(0, floor(now) − c)`` seconds (:meth:`floor`).
    """

    origin: float
    period: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.origin) and math.isfinite(self.period) and self.period > 0):
            raise ValueError(f"an unlock grid needs a finite origin and a positive period, got {self!r}")

    def instant(self, k: int) -> float:
        """The k-th instant of the grid (computed by multiplication, never by accumulation)."""
        return self.origin + k * self.period

    def index(self, now: float) -> int:
        """The largest k with ``instant(k) ≤ now`` (−1 before the origin), robust to rounding."""
        k = math.floor((now - self.origin) / self.period)
        if self.instant(k + 1) <= now:
            k += 1
        elif self.instant(k) > now:
            k -= 1
        return max(k, -1)

    def floor(self, now: float) -> float:
        """The latest instant of the grid at or before ``now`` (−inf before the origin)."""
        k = self.index(now)
        return self.instant(k) if k >= 0 else -math.inf


def unlocked_fraction(rule: UnlockRule, arrivals: np.ndarray, elapsed: np.ndarray) -> np.ndarray:
    """The fraction of capacity ``rule`` has released on each block (docs/design.md §4.1):

    ``min(1, on_block_created() + arrivals × on_pipeline_arrival() + on_tick(max(0, elapsed)))``

    where ``arrivals`` counts the pipelines that asked for the block and ``elapsed`` is the
    clock time the rule has counted since the block's creation (Luo et al., OSDI'21 §4.1:
    DPF-N releases ε_G/N per arrival, DPF-T releases ε_G·Δt/T).
    """
    target = rule.on_block_created() + np.asarray(arrivals, dtype=float) * rule.on_pipeline_arrival()
    return np.minimum(target + rule.on_tick(np.maximum(elapsed, 0.0)), 1.0)


def block_unlocked_fraction(rule: UnlockRule, arrivals: float, elapsed: float) -> float:
    """:func:`unlocked_fraction` of one block in Python floats: the same IEEE operations in the
    same order, hence the same bits, without array overheads (the simulator's per-arrival path)."""
    return float(min(rule.on_block_created() + arrivals * rule.on_pipeline_arrival() + rule.on_tick(max(elapsed, 0.0)), 1.0))


def unlock_amounts(capacity: np.ndarray, locked: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The budget (B, K) that raises each block's unlocked share to ``target`` (B,): what the
    ledger moves for the same targets (:func:`~privsched.budgets.exact.raised`, exact quanta,
    independent of the steps taken, idempotent)."""
    return raised(capacity, locked, target)


# -- when a demand will fit -------------------------------------------------------------------
#
# The unlock computation above raises a block's unlocked share to the rule's target; a demand
# fits the block once ``unlocked + unlock_amounts(target)`` holds it (docs/design.md
# §3.3). Every step of that computation is monotone in the target (each float operation is),
# and the target is monotone in the clock and in the arrivals, so the earliest instant (or
# the fewest arrivals) at which a demand fits is found by bisection on the very functions the
# scheduler applies: at the answer the demand fits, one float (or one arrival) before it does
# not. "If nothing else is granted": the unlocked budget only grows meanwhile.


def fits_at_target(
    accounting: Accounting, demand: np.ndarray, unlocked: np.ndarray, capacity: np.ndarray, locked: np.ndarray, target: np.ndarray
) -> np.ndarray:
    """Whether each demand (E, K) fits its block (E, K balances) once the block's unlocked
    share is raised to ``target`` (E,) by :func:`unlock_amounts`."""
    available = plus(unlocked, unlock_amounts(capacity, locked, np.asarray(target, dtype=float)), up=False)
    return accounting.fits(demand, available, accounting.live(capacity))


def _first_true(predicate, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The smallest integer x in (low, high] with ``predicate(x)``, element-wise, for a
    predicate monotone in x that is false at ``low`` and true at ``high`` (int64 arrays)."""
    low, high = low.copy(), high.copy()
    while True:
        open_ = high - low > 1
        if not open_.any():
            return high
        mid = np.where(open_, low // 2 + high // 2 + (low % 2 + high % 2) // 2, high)  # no overflow
        ok = predicate(mid)
        high = np.where(open_ & ok, mid, high)
        low = np.where(open_ & ~ok, mid, low)


_SIGN = np.int64(-(2**63))


def _float_key(x: float | np.ndarray) -> np.ndarray:
    """An int64 per float, in the floats' order (consecutive floats: consecutive keys)."""
    bits = np.atleast_1d(np.asarray(x, dtype=np.float64)).view(np.int64)
    return np.where(bits < 0, _SIGN - np.minimum(bits, 0), bits)


def _key_float(key: np.ndarray) -> np.ndarray:
    bits = np.where(key < 0, _SIGN - np.minimum(key, 0), key).astype(np.int64)
    return bits.view(np.float64)


def earliest_fit_time(
    rule: UnlockRule,
    accounting: Accounting,
    demand: np.ndarray,
    unlocked: np.ndarray,
    capacity: np.ndarray,
    locked: np.ndarray,
    arrivals: np.ndarray,
    created: np.ndarray,
    now: float,
    grid: UnlockGrid | None = None,
) -> np.ndarray:
    """The earliest clock time ≥ ``now`` at which each demand (E, K) fits its block under a
    per-time rule if nothing else is granted meanwhile: ``now`` when it fits at once, +inf
    when it never fits, not even fully unlocked. Each block has balances (E, K), the
    ``arrivals`` that asked for it and its creation time ``created`` (E,).

    At time t the rule's target is :func:`unlocked_fraction` of ``t − created`` (t rounded
    down to ``grid``'s instants, as the scheduler counts it): ``elapsed / lifetime`` for
    DPF-T (Luo et al., OSDI'21 §4.1). The answer t* is exact on floats: the demand fits at
    t* and not at the float before it (with a grid: not at the instant before it). A
    pipeline fits when all its blocks do: at the largest t* of its edges."""
    arrivals = np.asarray(arrivals, dtype=float)
    created = np.asarray(created, dtype=float)
    count = len(created)
    rate = float(rule.on_tick(1.0))
    counted_now = now if grid is None else grid.floor(now)

    def target_at(counted: np.ndarray) -> np.ndarray:
        return unlocked_fraction(rule, arrivals, counted - created)

    def fits(counted: np.ndarray) -> np.ndarray:
        return fits_at_target(accounting, demand, unlocked, capacity, locked, target_at(counted))

    answer = np.full(count, math.inf)
    if count == 0:
        return answer
    now_fits = fits(np.full(count, counted_now))
    answer[now_fits] = now
    if rate <= 0:  # time unlocks nothing under this rule
        return answer
    # Fully unlocked by then (the target reaches 1 lifetime/… after creation), a little later for rounding.
    full = created + (1.0 / rate) * (1 + 1e-9) + 1.0
    if grid is not None:
        full = np.array([grid.instant(grid.index(float(f)) + 1) for f in full])
    full = np.maximum(full, now)
    later = ~now_fits & fits(full)
    if not later.any():
        return answer
    rows = np.flatnonzero(later)

    def sub(counted: np.ndarray) -> np.ndarray:
        return fits_at_target(
            accounting,
            demand[rows],
            unlocked[rows],
            capacity[rows],
            locked[rows],
            unlocked_fraction(rule, arrivals[rows], counted - created[rows]),
        )

    if grid is None:
        keys = _first_true(lambda key: sub(_key_float(key)), np.full(len(rows), _float_key(now)[0]), _float_key(full[rows]))
        answer[rows] = _key_float(keys)
    else:
        ks = _first_true(
            lambda k: sub(grid.origin + k * grid.period),
            np.full(len(rows), grid.index(now), dtype=np.int64),
            np.array([grid.index(float(f)) for f in full[rows]], dtype=np.int64),
        )
        answer[rows] = grid.origin + ks * grid.period
    return answer


def arrivals_to_fit(
    rule: UnlockRule,
    accounting: Accounting,
    demand: np.ndarray,
    unlocked: np.ndarray,
    capacity: np.ndarray,
    locked: np.ndarray,
    arrivals: np.ndarray,
    elapsed: np.ndarray,
) -> np.ndarray:
    """The fewest further pipeline arrivals on its block after which each demand (E, K) fits
    under a per-arrival rule, if nothing else is granted meanwhile: 0 when it fits at once,
    -1 when no number of arrivals makes it fit. Each arrival asking for a block unlocks
    ``capacity / N`` there (DPF-N, Luo et al., OSDI'21 §4.1); ``arrivals`` counts those so
    far and ``elapsed`` is the time counted since each block's creation (E,). Exact: the
    demand fits after k* arrivals and not after k* − 1."""
    arrivals = np.asarray(arrivals, dtype=np.int64)
    elapsed = np.asarray(elapsed, dtype=float)
    count = len(arrivals)

    def fits(more: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        target = unlocked_fraction(rule, arrivals[rows] + more, elapsed[rows])
        return fits_at_target(accounting, demand[rows], unlocked[rows], capacity[rows], locked[rows], target)

    answer = np.full(count, -1, dtype=np.int64)
    if count == 0:
        return answer
    now_fits = fits(np.zeros(count, dtype=np.int64))
    answer[now_fits] = 0
    share = float(rule.on_pipeline_arrival())
    if share <= 0:  # arrivals unlock nothing under this rule
        return answer
    enough = np.full(count, math.ceil(1.0 / share) + 1, dtype=np.int64)  # the target reaches 1 by then
    rows = np.flatnonzero(~now_fits & fits(enough))
    if len(rows):
        answer[rows] = _first_true(lambda more: fits(more, rows), np.zeros(len(rows), dtype=np.int64), enough[rows])
    return answer
