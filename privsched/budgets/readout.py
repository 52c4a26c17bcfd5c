"""A budget vector read as the (ε, δ) guarantee it stands for, for people to read."""

from __future__ import annotations

import numpy as np

from privsched.budgets.accounting import Accounting


def as_epsilon_delta(vector: np.ndarray, accounting: Accounting, capacity: np.ndarray, delta: float) -> tuple[float, float]:
    """Basic accounting: the vector is (ε, δ) already. RDP: the ε that the curve guarantees at
    ``delta`` (``rdp_to_epsilon``, the conversion of docs/design.md §3.1) over the live orders where
    it is positive, and 0 where there are none."""
    if not accounting.is_rdp:
        return float(vector[0]), float(vector[1])
    from privsched.budgets.curves import rdp_to_epsilon

    usable = accounting.live(capacity) & (np.asarray(vector) > 0)
    if not usable.any():
        return 0.0, delta
    epsilon, _ = rdp_to_epsilon(np.asarray(vector)[usable], np.asarray(accounting.alphas)[usable], delta)
    return float(epsilon), delta
