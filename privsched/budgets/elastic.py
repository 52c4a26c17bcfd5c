"""Elastic demands (docs/design.md §10): a pipeline asks for ε in a range [ε_min, ε_max], its
demand is the curve of its mechanism planned at ε_max, and a policy grants a fraction f of
that demand on every block, all or nothing.

- :func:`minimum_fraction` is the least f the pipeline accepts: the smallest f with
  ``f · d_max(α) ≥ d_min(α)`` at every live order, where d_max and d_min are the curves of
  the mechanism planned at ε_max and at ε_min. A grant of f ≥ that minimum then holds the
  ε_min mechanism's whole curve, so the job can always run a mechanism at least as strong as
  the one it asked for at ε_min.
- :func:`granted_amount` is what a grant of f moves: f · demand on the quantum grid, rounded
  up (a grant may only be larger than f · demand, never smaller, and at most the demand).
- :func:`calibrate` finds the largest ε in the range whose planned mechanism's curve fits
  the grant at every order. Each plan's noise is a decreasing function of its target ε (a
  Laplace scale Δ/ε, Dwork & Roth 2014 Thm 3.6; a Gaussian σ = Δ·sqrt(2 ln(1.25/δ))/ε, Thm
  A.1; a DP-SGD noise multiplier from Opacus' calibration for (ε, δ)), and its RDP curve a
  decreasing function of the noise (Laplace: Mironov 2017 Prop. 6; Gaussian α/(2σ²), Prop. 7;
  subsampled Gaussian: Mironov, Talwar & Zhang 2019), so the bisection over ε is a bisection
  over σ or the scale. The curve a grant is measured against is the grant itself, so whatever
  the job spends is within it at every order (docs/privacy.md, "Elastic demands").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from privsched.budgets.accounting import Accounting, leq
from privsched.budgets.exact import quantize

Plan = TypeVar("Plan")

#: Bisection steps of :func:`calibrate`: the range shrinks to 2⁻²⁴ of its width.
STEPS = 24


def minimum_fraction(least: np.ndarray, most: np.ndarray, live: np.ndarray) -> float:
    """The smallest f in (0, 1] with ``f · most ≥ least`` at every ``live`` dimension (``least``
    and ``most``: the demand curves planned at ε_min and at ε_max), checked in floating point
    and raised by ulps until it holds (a dimension where both are 0, such as the δ of a pure-DP
    demand, holds for any f). Raises ``ValueError`` if ``least`` exceeds ``most`` somewhere
    (a range whose min costs more than its max)."""
    least, most = np.asarray(least, dtype=float)[live], np.asarray(most, dtype=float)[live]
    if np.any(least > most):
        raise ValueError("the mechanism planned at the range's min costs more than at its max")
    least, most = least[most > 0], most[most > 0]
    fraction = float(np.max(least / most)) if least.size else 1.0
    while fraction < 1.0 and np.any(fraction * most < least):
        fraction = float(np.nextafter(fraction, 2.0))
    return min(fraction, 1.0)


def granted_amount(demand: np.ndarray, fraction: float | None) -> np.ndarray:
    """What a grant of ``fraction`` of ``demand`` moves (None or 1: the demand itself): f ·
    demand rounded up to the quantum grid (:mod:`privsched.budgets.exact`), at most the demand."""
    demand = np.asarray(demand, dtype=float)
    if fraction is None or fraction >= 1.0:
        return demand
    return np.minimum(quantize(fraction * demand, up=True), demand)


def calibrate(
    plan: Callable[[float], Plan], curve: Callable[[Plan], np.ndarray], low: float, high: float, grant: np.ndarray
) -> tuple[float, Plan]:
    """The largest ε in [low, high] (to 2⁻²⁴ of the range) whose ``plan(ε)`` has a ``curve``
    within ``grant`` at every dimension, and that plan. ``plan(high)`` is tried first (a whole
    grant needs no search). Raises ``ValueError`` when not even ``plan(low)`` fits."""
    best = plan(high)
    if np.all(leq(curve(best), grant)):
        return high, best
    best = plan(low)
    if not np.all(leq(curve(best), grant)):
        raise ValueError(f"the grant does not hold the mechanism planned at epsilon {low:g}")
    for _ in range(STEPS):
        middle = (low + high) / 2
        candidate = plan(middle)
        if np.all(leq(curve(candidate), grant)):
            low, best = middle, candidate
        else:
            high = middle
    return low, best


def granted_epsilon(grant: np.ndarray, low: float, high: float, delta: float, accounting: Accounting) -> float:
    """The largest ε in [low, high] whose plain (ε, δ) declaration
    (:class:`~privsched.budgets.mechanisms.EpsilonDelta`: min(ε, αε²/2) under RDP, Bun &
    Steinke 2016 Prop. 3.3; (ε, δ) under basic) fits ``grant``: what a code job granted a
    fraction of its elastic demand may spend through its primitives."""
    from privsched.budgets.mechanisms import EpsilonDelta, demand_vector

    epsilon, _ = calibrate(lambda e: EpsilonDelta(epsilon=e, delta=delta), lambda m: demand_vector(m, accounting), low, high, grant)
    return epsilon
