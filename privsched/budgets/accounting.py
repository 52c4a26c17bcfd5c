"""Accounting modes and the vectorised budget algebra every policy and the ledger share.

A budget is a float array whose last axis holds its *dimensions*:
- basic (ε, δ) composition: two dimensions, (ε, δ); both add up, and a demand fits only
  if it fits in every dimension (docs/design.md §3.1, §3.3).
- RDP: one dimension per Rényi order α of the dataset's grid; curves add, and a demand fits
  a block if it fits at *some* live order (Luo et al., OSDI'21 §4.2; Mironov 2017).

All functions broadcast over leading axes, so a policy can test thousands of
(pipeline, block) pairs in one call. NumPy is imported by the functions that compute, so
that reading an accounting mode (``privsched dataset list``) does not load it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from privsched.budgets.bounds import MAX_ORDER

if TYPE_CHECKING:
    import numpy as np

AccountingName = Literal["basic", "rdp"]

#: Default RDP order grid (docs/design.md §3.1).
DEFAULT_ALPHAS: tuple[float, ...] = (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 16.0, 32.0, 64.0)

#: Relative tolerance of the audit's replay, which recomputes balances by summing events in
#: another order and compares them with the stored ones. It is never used to grant budget.
RELATIVE_TOLERANCE = 1e-9


def leq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise, exact ``a <= b``: a budget test that errs only by refusing.

    No tolerance: a demand above the available budget by any amount, even one part in
    10⁹, does not fit (docs/design.md §3.3), and a NaN demand never fits. Float rounding (N unlocks
    of capacity/N summing a hair below capacity) can only make a demand refused.
    """
    import numpy as np

    with np.errstate(invalid="ignore"):
        return np.asarray(a, dtype=float) <= np.asarray(b, dtype=float)


@dataclass(frozen=True)
class Accounting:
    """An accounting mode and, under RDP, its order grid."""

    name: AccountingName
    alphas: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in ("basic", "rdp"):
            raise ValueError(f"unknown accounting mode {self.name!r} (expected 'basic' or 'rdp')")
        if self.name == "basic" and self.alphas:
            raise ValueError("basic accounting takes no RDP orders")
        if self.name == "rdp":
            if not self.alphas:
                raise ValueError("rdp accounting needs at least one order")
            alphas = [float(a) for a in self.alphas]
            if not all(math.isfinite(a) and 1 < a <= MAX_ORDER for a in alphas):
                raise ValueError(f"RDP orders must be finite, greater than 1 and at most {MAX_ORDER:g}")
            if any(later <= earlier for earlier, later in zip(alphas, alphas[1:])):
                raise ValueError("RDP orders must be strictly increasing")

    @classmethod
    def basic(cls) -> Accounting:
        return cls("basic")

    @classmethod
    def rdp(cls, alphas: tuple[float, ...] | list[float] | None = None) -> Accounting:
        return cls("rdp", tuple(float(a) for a in (alphas if alphas is not None else DEFAULT_ALPHAS)))

    @property
    def is_rdp(self) -> bool:
        return self.name == "rdp"

    @property
    def dims(self) -> int:
        """Length of the budget vectors: 2 for (ε, δ), one per order under RDP."""
        return len(self.alphas) if self.is_rdp else 2

    def live(self, capacity: np.ndarray) -> np.ndarray:
        """Mask of the dimensions that count: under RDP, orders with positive capacity.

        Dead orders (capacity ≤ 0) can never hold any demand and are ignored everywhere.
        Under basic accounting every dimension counts.
        """
        import numpy as np

        capacity = np.asarray(capacity, dtype=float)
        if self.is_rdp:
            return capacity > 0
        return np.ones(capacity.shape, dtype=bool)

    def fits(self, demand: np.ndarray, available: np.ndarray, live: np.ndarray) -> np.ndarray:
        """Whether each demand fits the available budget (reduces the last axis), compared
        exactly in quanta (:mod:`privsched.budgets.exact`: the demand rounded up, the budget
        down, a decimal such as 0.1 taken as it is).

        basic: ``d ≤ available`` in ε and in δ. RDP: there exists a live α with
        ``d(α) ≤ available(α)`` (docs/design.md §3.3).
        """
        from privsched.budgets.exact import units

        return self.fits_units(units(demand, up=True), units(available, up=False), live)

    def fits_units(self, demand: np.ndarray, available: np.ndarray, live: np.ndarray) -> np.ndarray:
        """:meth:`fits` for budgets already in quanta (int64)."""
        import numpy as np

        ok = demand <= available
        if self.is_rdp:
            return np.any(ok & live, axis=-1)
        return np.all(ok, axis=-1)

    def is_safe(self, spent: np.ndarray | list[np.ndarray], capacity: np.ndarray) -> np.ndarray:
        """The ledger's safety invariant for budgets already given out (allocated + consumed),
        in exact quanta (:mod:`privsched.budgets.exact`). ``spent`` is the list of the
        buckets given out, summed here in quanta (or one array).

        basic: spent ≤ capacity in every dimension. RDP: some live order keeps
        spent(α) ≤ capacity(α) (docs/design.md §3.3). Reduces the last axis.
        """
        import numpy as np

        from privsched.budgets.exact import clamp, units

        parts = spent if isinstance(spent, (list, tuple)) else [spent]
        total = units(parts[0], up=True)
        for part in parts[1:]:
            total = clamp(total + units(part, up=True))
        capacity = np.asarray(capacity, dtype=float)
        return self.fits_units(total, units(capacity, up=False), self.live(capacity))

    def shares(self, demand: np.ndarray, capacity: np.ndarray) -> np.ndarray:
        """Per-dimension share ``d / capacity``; 0 on dead or zero-capacity dimensions.

        DPF's dominant share is the maximum of these over a pipeline's blocks
        (Luo et al., OSDI'21 §4.1).
        """
        import numpy as np

        demand = np.asarray(demand, dtype=float)
        capacity = np.asarray(capacity, dtype=float)
        live = self.live(capacity) & (capacity > 0)
        safe = np.where(live, capacity, 1.0)
        with np.errstate(over="ignore"):  # a huge demand on a tiny capacity: an infinite share
            return np.where(live, demand / safe, 0.0)

    def dimension_labels(self) -> list[str]:
        """Human-readable names of the dimensions, for tables and logs."""
        if self.is_rdp:
            return [f"α={a:g}" for a in self.alphas]
        return ["ε", "δ"]

    def to_dict(self) -> dict:
        return {"accounting": self.name, "alphas": list(self.alphas)}

    @classmethod
    def from_dict(cls, data: dict) -> Accounting:
        name = data["accounting"]
        return cls.rdp(data.get("alphas") or None) if name == "rdp" else cls.basic()
