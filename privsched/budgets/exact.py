"""Exact budget arithmetic: budgets as integer numbers of a decimal quantum (docs/design.md §3.3).

Every admission decision (the ledger's grant, a team's quota, a policy's fit test) compares
budgets as integers of one quantum, 10⁻¹² (:data:`DIGITS`), so that sums of decimal demands are exact:
100 demands of 0.01 fill a capacity of 1.0 exactly, and a quota of 0.3 holds three of 0.1.

A float becomes quanta (:func:`units`) exactly when it *is* a decimal of at most twelve
digits after the point: the float nearest to ``n · 10⁻¹²`` for an integer n (the user's 0.1,
0.01, 1e-9), within ±8,000 (:data:`EXACT`). Any other value is rounded towards refusal:
a demand up (``up=True``), a capacity, unlocked budget or quota down. Magnitudes beyond
:data:`LIMIT` (demands) or :data:`BUDGET` (budgets) saturate. The ledger stores each balance as
the float of its quanta (:func:`quantize`), so it reads back as the same integer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

#: Decimal digits after the point of one quantum.
DIGITS = 12
#: Quanta per unit of budget (exact as a float).
SCALE = 10.0**DIGITS
#: Decimals of up to this many quanta in magnitude (8,000) are taken exactly: below 2¹³ two
#: decimals 10⁻¹² apart are distinct floats, and a float's product with :data:`SCALE` lies
#: within two quanta of its decimal.
EXACT = 8 * 10**15
#: Saturation: a demand is at most LIMIT quanta and any value at least −LIMIT, so that a
#: sum of two never overflows.
LIMIT = 2**61
#: A budget (capacity, unlocked, quota) counts at most this many quanta (8,000): more is
#: never needed, and sums of hundreds of demands clipped to it stay within int64.
BUDGET = EXACT


def units(x: np.ndarray | float, up: bool) -> np.ndarray:
    """``x`` (any shape) in quanta, int64: exact for a decimal of at most :data:`DIGITS` digits
    after the point (module docstring), else rounded up (``up``) or down. NaN counts as a
    refusal: +LIMIT up, −LIMIT down."""
    import numpy as np

    x = np.asarray(x, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = x * SCALE
        near = np.rint(scaled)
        exact = near / SCALE == x
        if exact.all() and (near.size == 0 or -EXACT <= near.min() and near.max() <= EXACT):
            return near.astype(np.int64)  # every value a decimal on the grid (the usual case)
        exact &= np.abs(near) <= EXACT
        # Beyond 2⁵¹ quanta the product may miss its decimal by up to two quanta.
        far = ~exact & (np.abs(near) > 2**51) & (np.abs(near) <= EXACT + 2)
        if far.any():
            for offset in (-2.0, -1.0, 1.0, 2.0):
                hit = far & ~exact & (np.abs(near + offset) <= EXACT) & ((near + offset) / SCALE == x)
                near = np.where(hit, near + offset, near)
                exact |= hit
        # The float product is within half an ulp of x · SCALE: one more ulp bounds it.
        bound = np.ceil(np.nextafter(scaled, np.inf)) if up else np.floor(np.nextafter(scaled, -np.inf))
        value = np.where(exact, near, bound)
        value = np.where(np.isnan(value), LIMIT if up else -LIMIT, value)
        value = np.minimum(np.maximum(value, -LIMIT), LIMIT if up else BUDGET)  # not np.clip: slow on small arrays
    return value.astype(np.int64)


def clamp(u: np.ndarray) -> np.ndarray:
    """Quanta kept within ±:data:`LIMIT` after a subtraction or addition: below −LIMIT nothing
    fits anyway, and no demand is larger than LIMIT."""
    import numpy as np

    return np.minimum(np.maximum(u, -LIMIT), LIMIT)


def value(u: np.ndarray) -> np.ndarray:
    """Quanta as budget floats: the float nearest to ``u · 10⁻¹²``, which :func:`units` reads
    back as ``u`` within ±:data:`EXACT`."""
    import numpy as np

    return np.asarray(u, dtype=np.int64).astype(float) / SCALE


def on_grid(x: np.ndarray | float) -> bool:
    """Whether every value of ``x`` is a decimal on the quantum grid (taken exactly)."""
    import numpy as np

    return bool(np.array_equal(units(x, up=True), units(x, up=False)))


def quantize(x: np.ndarray | float, up: bool) -> np.ndarray:
    """``x`` on the quantum grid: ``value(units(x, up))``."""
    return value(units(x, up))


def plus(a: np.ndarray | float, b: np.ndarray | float, up: bool) -> np.ndarray:
    """``a + b`` in quanta, as a float on the grid; inputs off the grid rounded by ``up``."""
    return value(clamp(units(a, up) + units(b, up)))


def minus(a: np.ndarray | float, b: np.ndarray | float, up: bool) -> np.ndarray:
    """``a − b`` in quanta, as a float on the grid; ``a`` off the grid rounded by ``up`` and
    ``b`` the other way (so that ``up=False`` never makes the difference larger)."""
    return value(clamp(units(a, up) - units(b, not up)))


def share_of(share: float, capacity: np.ndarray) -> np.ndarray:
    """``share × capacity`` in quanta for a share in [0, 1], rounded down (a quota never
    admits more than its share), in exact integer arithmetic: with s and c the quanta of
    share and capacity, ``⌊s·c / 10¹²⌋`` worked out in int64 pieces that cannot overflow."""
    import numpy as np

    if not 0.0 <= share <= 1.0:
        raise ValueError(f"a share must be in [0, 1], got {share!r}")
    s = int(units(share, up=False))
    c = units(capacity, up=False)
    whole, rest = np.divmod(c, 10**DIGITS)  # c = whole·10¹² + rest, 0 ≤ rest < 10¹²
    high, low = np.divmod(rest, 10**6)
    a, b = s * high, s * low  # each below 10¹⁸
    carry, left = np.divmod(a, 10**6)
    return clamp(s * whole + carry + (left * 10**6 + b) // 10**DIGITS)


def sum_at(n: int, index: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Each of ``n`` groups' sum of ``rows`` (quanta, (R, K)) by ``index`` (R,), exact: in
    int64 when no sum can reach 2⁶², else as Python integers; clipped to ±:data:`LIMIT`."""
    import numpy as np

    rows = np.asarray(rows, dtype=np.int64)
    width = rows.shape[1]
    if len(rows) == 0 or int(np.abs(rows).max()) * int(np.bincount(index).max()) < 2**62:
        total = np.zeros((n, width), dtype=np.int64)
        np.add.at(total, index, rows)
        return clamp(total)
    exact = np.zeros((n, width), dtype=object)
    np.add.at(exact, index, rows.astype(object))
    return np.clip(exact, -LIMIT, LIMIT).astype(np.int64)


def raised(capacity: np.ndarray, locked: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The budget (B, K) to move from locked to unlocked so that each block's unlocked share
    reaches ``target`` (B,) (docs/design.md §4.1): ``⌊target × capacity⌋ − (capacity − locked)``
    in quanta, within [0, locked], and all that is locked at a target of 1. It depends on the
    target alone, not on the steps taken to reach it, so that a block unlocked tick by tick
    and one unlocked at once hold the same budget; asking again gives 0 (idempotent)."""
    import numpy as np

    capacity = np.asarray(capacity, dtype=float)
    return value(raised_units(capacity, units(capacity, up=False), units(locked, up=False), target))


def raised_units(capacity: np.ndarray, capacity_units: np.ndarray, locked_units: np.ndarray, target: np.ndarray) -> np.ndarray:
    """:func:`raised` in quanta, for balances already in quanta (the simulator's)."""
    import numpy as np

    target = np.asarray(target, dtype=float)
    goal = units(target[:, None] * capacity, up=False)
    amount = np.minimum(np.maximum(goal - (capacity_units - locked_units), 0), np.maximum(locked_units, 0))
    full = target >= 1.0
    amount[full] = np.maximum(locked_units[full], 0)
    return amount


def units_of(x: float, up: bool) -> int:
    """:func:`units` of one float, in Python arithmetic (the same IEEE operations, hence the
    same result, without array overheads: the simulator's one-block paths)."""
    import math

    scaled = x * SCALE
    if -(2**51) < scaled < 2**51:  # the common case: no saturation, no far decimal
        near = round(scaled)
        if near / SCALE == x:
            return near
        return math.ceil(math.nextafter(scaled, math.inf)) if up else math.floor(math.nextafter(scaled, -math.inf))
    if math.isnan(x):
        return LIMIT if up else -LIMIT
    if math.isinf(scaled):
        return LIMIT if up and scaled > 0 else (-LIMIT if scaled < 0 else BUDGET)
    near = round(scaled)
    exact = abs(near) <= EXACT and near / SCALE == x
    if not exact and abs(near) <= EXACT + 2:
        for offset in (-2, -1, 1, 2):
            if abs(near + offset) <= EXACT and (near + offset) / SCALE == x:
                near, exact = near + offset, True
                break
    if not exact:
        near = math.ceil(math.nextafter(scaled, math.inf)) if up else math.floor(math.nextafter(scaled, -math.inf))
    return max(-LIMIT, min(near, LIMIT if up else BUDGET))


def raised_of(capacity: list[float], capacity_units: list[int], locked_units: list[int], target: float) -> list[int]:
    """:func:`raised_units` of one block, in Python arithmetic (the same result)."""
    if target >= 1.0:
        return [max(left, 0) for left in locked_units]
    return [
        min(max(units_of(target * cap, up=False) - (total - left), 0), max(left, 0))
        for cap, total, left in zip(capacity, capacity_units, locked_units)
    ]
