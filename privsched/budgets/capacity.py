"""Block capacity from a global (ε_G, δ_G) guarantee (docs/design.md §3.2)."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_EPSILON, MIN_EPSILON, check_delta, check_number

Conversion = Literal["paper", "tight", "paper-adaptive", "tight-adaptive"]

#: The capacity rules, with the guarantee each gives under *adaptively* chosen demands.
CONVERSIONS: tuple[str, ...] = ("paper", "tight", "paper-adaptive", "tight-adaptive")


def validate_epsilon_delta(epsilon: float, delta: float) -> None:
    """Raise ``ValueError`` unless ε and δ lie in the ranges of :mod:`privsched.budgets.bounds`."""
    check_number(epsilon, "epsilon", MIN_EPSILON, MAX_EPSILON)
    check_delta(delta, "delta")


def rdp_capacity(epsilon: float, delta: float, alphas: tuple[float, ...] | np.ndarray, conversion: Conversion = "paper") -> np.ndarray:
    """RDP capacity curve ε_G(α) that guarantees (ε_G, δ_G)-DP through composition.

    ``paper`` (Luo et al., OSDI'21 §4.2, from Mironov 2017 Prop. 3):
        ε_G(α) = max(0, ε_G − ln(1/δ_G) / (α − 1)).
    ``tight`` (Canonne, Kamath & Steinke 2020 Prop. 12; Balle et al. 2020): any curve with
    ε(α) + (ln(1/δ) − ln α)/(α − 1) + ln(1 − 1/α) ≤ ε_G converts to (ε_G, δ_G)-DP, so
        ε_G(α) = max(0, ε_G − (ln(1/δ_G) − ln α)/(α − 1) − ln(1 − 1/α)),
    about 10–16 % more capacity at α = 4–5 for ε_G = 10, δ_G = 1e-7.
    Orders with capacity 0 are dead for the block.

    Adaptivity. The ledger admits a demand when *some* order α fits, so the order that
    ends up within capacity is chosen by the data-dependent sequence of demands. With demands
    fixed in advance, the block is (ε_G, δ_G)-DP through the one order that holds. With
    demands chosen adaptively (analysts react to releases, refunds depend on data), each
    order α is an RDP filter (Feldman & Zrnic 2021, Thm. 3.1; Lécuyer 2021), valid at its own
    α, and a union bound over the orders A gives (ε_G, |A|·δ_G) for ``paper``/``tight``. The
    ``-adaptive`` rules convert each order with δ_G/|A| (|A| = the whole grid), so that the
    union bound gives (ε_G, δ_G) under adaptive demands at the cost of ln|A|/(α − 1) of
    capacity per order.
    """
    validate_epsilon_delta(epsilon, delta)
    if delta <= 0:
        raise ValueError("RDP accounting needs delta > 0 to convert to (epsilon, delta)")
    a = np.asarray(alphas, dtype=float)
    if conversion.endswith("-adaptive"):
        delta, conversion = delta / a.size, conversion.removesuffix("-adaptive")  # type: ignore[assignment]
    if conversion == "paper":
        curve = epsilon - math.log(1 / delta) / (a - 1)
    elif conversion == "tight":
        curve = epsilon - (math.log(1 / delta) - np.log(a)) / (a - 1) - np.log1p(-1 / a)
    else:
        raise ValueError(f"unknown conversion {conversion!r} (expected one of {', '.join(CONVERSIONS)})")
    return np.maximum(curve, 0.0)


def block_capacity(accounting: Accounting, epsilon: float, delta: float, conversion: Conversion = "paper") -> np.ndarray:
    """A block's capacity vector: (ε_G, δ_G) under basic accounting, ε_G(α) under RDP; on
    the exact quantum grid, rounded down (:mod:`privsched.budgets.exact`: a decimal ε_G
    such as 1.0 is kept as it is)."""
    from privsched.budgets.exact import quantize

    if accounting.is_rdp:
        return quantize(rdp_capacity(epsilon, delta, accounting.alphas, conversion), up=False)
    validate_epsilon_delta(epsilon, delta)
    return quantize(np.array([float(epsilon), float(delta)]), up=False)
