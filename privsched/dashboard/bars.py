"""A block's budget as one stacked bar: the fractions of its capacity that are consumed,
allocated, unlocked and still locked, read at the block's *reference dimension*.

A budget vector has one entry per dimension (ε and δ under basic accounting, one per RDP
order α). One bar needs one dimension:

- basic accounting: a demand must fit in ε *and* δ, so the bar shows the binding dimension,
  the one with the smallest remaining fraction (capacity − allocated − consumed)/capacity;
- RDP: a demand fits when it fits at *some* live order (docs/design.md §3.3), so the bar
  shows the block's best order, the live order with the largest remaining fraction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.ledger import BlockInfo

BUCKETS = ("consumed", "allocated", "unlocked", "locked")


@dataclass(frozen=True)
class BudgetBar:
    """Fractions of one block's capacity at its reference dimension (each in [0, 1], summing
    to at most 1), and that dimension's label ("ε", "δ" or "α=8")."""

    consumed: float
    allocated: float
    unlocked: float
    locked: float
    dimension: str

    def to_dict(self) -> dict[str, float | str]:
        return {bucket: getattr(self, bucket) for bucket in (*BUCKETS, "dimension")}


def reference_dimension(block: BlockInfo, accounting: Accounting) -> int:
    """Index of the dimension a bar shows: the binding one (basic) or the best order (RDP)."""
    live = accounting.live(block.capacity)
    if not live.any():
        return 0
    capacity = np.where(live, block.capacity, 1.0)
    remaining = np.where(live, block.remaining / capacity, np.nan)
    return int(np.nanargmax(remaining) if accounting.is_rdp else np.nanargmin(remaining))


def budget_bar(block: BlockInfo, accounting: Accounting) -> BudgetBar:
    """The block's bar. Under RDP the unlocked bucket may be negative at some orders
    (docs/design.md §3.3); fractions are clipped to [0, 1] and filled in the order consumed, allocated,
    unlocked, locked so that the bar never exceeds the capacity."""
    dimension = reference_dimension(block, accounting)
    capacity = float(block.capacity[dimension])
    left = 1.0
    fractions = {}
    for bucket in BUCKETS:
        share = float(getattr(block, bucket)[dimension]) / capacity if capacity > 0 else 0.0
        fractions[bucket] = min(max(share, 0.0), left)
        left -= fractions[bucket]
    return BudgetBar(**fractions, dimension=accounting.dimension_labels()[dimension])
