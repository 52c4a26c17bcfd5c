"""The exact (ε, δ) guarantee of the discrete Gaussian, and its noise calibrated on it.

OpenDP releases counts and histograms with the discrete Gaussian N_Z(0, σ²), the law on the
integers with P[Y = y] ∝ e^{−y²/(2σ²)} (Canonne, Kamath & Steinke 2020, "The Discrete
Gaussian for Differential Privacy"). At equal σ its δ(ε) differs from the continuous
Gaussian's (Balle & Wang 2018), above it in part of the (ε, δ) plane, so under basic
accounting its σ is calibrated on its own profile:

- CKS 2020, Thm 7: adding Y ~ N_Z(0, σ²) to an integer query of sensitivity Δ is (ε, δ)-DP
  for δ = P[Y > εσ²/Δ − Δ/2] − e^ε P[Y > εσ²/Δ + Δ/2], and for no smaller δ.
- For an integer Δ the two tails pair term by term (u ↦ u + Δ), which gives
  δ = Σ_{u > t} p(u)·(1 − e^{ε − (2uΔ + Δ²)/(2σ²)}), t = εσ²/Δ − Δ/2: a sum of terms that
  are all ≥ 0, which floating point adds without cancellation. The boundary term's factor
  is computed from 2σ²ε − Δ² − 2uΔ in exact rational arithmetic (σ and ε are exact binary
  fractions), so that it keeps its relative accuracy however close u is to t.

Where the sum is too long to add (σ above about 5·10⁴, ε ≲ 10⁻⁴) or its integers leave the
range doubles hold exactly (εσ² above 2⁵⁰, where δ is far below 10⁻³⁰⁰), the calibration
uses instead the conversion of the discrete Gaussian's zero-concentrated DP, ρ = Δ²/(2σ²)
(the Rényi bound below at every α; CKS 2020, Cor. 13: δ ≤ e^{(α−1)(αρ−ε)}·(1 − 1/α)^α/(α − 1)
at every α > 1): an upper bound on the exact δ, so it costs a little more noise, never less.

Under RDP accounting the discrete Gaussian needs nothing of its own: its Rényi divergence is
at most the continuous Gaussian's, D_α(N_Z(μ, σ²) ‖ N_Z(ν, σ²)) ≤ α(μ − ν)²/(2σ²) for
integers μ, ν (CKS 2020, §2.1, Prop. 5), which is the curve charged (Mironov 2017, Prop. 7).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

#: A term below e^{−TAIL} of the largest is left out of a sum (e^{−45} ≈ 3e−20: below the
#: rounding of the terms kept, and the left-out tail of a Gaussian sum is smaller still).
TAIL = 45.0
#: Most terms :func:`discrete_gaussian_delta` sums (about 20σ of them): σ ≲ 5·10⁴.
MAX_TERMS = 2**20
#: Relative margin by which the calibration undershoots its δ: far above the rounding of
#: the computed δ (about 1e−12 relative), so that the exact δ stays below the charge.
CALIBRATION_MARGIN = 1e-6


def _check(sigma: float, epsilon: float, sensitivity: int) -> int:
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"noise sigma must be positive and finite, got {sigma!r}")
    if not epsilon >= 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    if isinstance(sensitivity, bool) or int(sensitivity) != sensitivity or sensitivity < 1:
        raise ValueError(f"the discrete Gaussian's sensitivity must be a whole number ≥ 1, got {sensitivity!r}")
    return int(sensitivity)


def _log_normaliser(two_var: float) -> float:
    """ln Σ_{z ∈ Z} e^{−z²/(2σ²)}, ``two_var`` = 2σ² (terms below e^{−TAIL} left out)."""
    reach = int(math.sqrt(TAIL * two_var)) + 1
    z = np.arange(1, reach + 1, dtype=float)
    return math.log1p(2.0 * math.fsum(np.exp(-(z * z) / two_var).tolist()))


def discrete_gaussian_log_delta(sigma: float, epsilon: float, sensitivity: int = 1) -> float:
    """ln δ(ε) of the discrete Gaussian N_Z(0, σ²) added to an integer query of sensitivity Δ
    (CKS 2020, Thm 7; see the module docstring), −inf where δ = 0. Accurate to about 1e−12
    relative in δ; raises ``ValueError`` where the sum would need more than
    :data:`MAX_TERMS` terms (σ above about 5·10⁴)."""
    delta_int = _check(sigma, epsilon, sensitivity)
    two_var_exact = 2 * Fraction(sigma) ** 2
    # u > t  ⟺  2uΔ > 2σ²ε − Δ² =: F; u0 is the smallest such integer.
    bound = two_var_exact * Fraction(epsilon) - delta_int**2
    u0 = math.floor(bound / (2 * delta_int)) + 1
    top = max(u0, 0)  # where p(u) is largest over u ≥ u0
    two_var = float(two_var_exact)
    last = math.isqrt(top * top + math.ceil(TAIL * two_var)) + 1
    if last - u0 + 1 > MAX_TERMS or 2 * math.sqrt(TAIL * two_var) > MAX_TERMS:
        raise ValueError(f"the discrete Gaussian's delta at sigma {sigma:g} needs more than {MAX_TERMS} terms")
    if last > 2**50:  # u + top would no longer be exact in a double (δ is below e^{-2^50/σ²} there)
        raise ValueError(f"the discrete Gaussian's delta at sigma {sigma:g} and epsilon {epsilon:g} is out of range")
    k = np.arange(last - u0 + 1, dtype=float)  # u = u0 + k, every value exact
    # The exponent of the factor, (F − 2uΔ)/(2σ²) < 0: its numerator at u0 exactly, then
    # minus 2kΔ (same signs: no cancellation).
    numerator = float(bound - 2 * delta_int * u0) - 2.0 * delta_int * k
    factor = -np.expm1(numerator / two_var)
    # u² − top² = (u − top)(u + top), both factors exact.
    weight = np.exp(-((k + (u0 - top)) * (k + (u0 + top))) / two_var)
    total = math.fsum((weight * factor).tolist())
    if total <= 0:
        return -math.inf
    return -(top * top) / two_var + math.log(total) - _log_normaliser(two_var)


def _zcdp_log_delta(rho: float, epsilon: float) -> float:
    """ln of the δ that ρ-zCDP implies at ε (CKS 2020, Cor. 13), at the α where
    f(α) = (α − 1)(αρ − ε) + (α − 1) ln(α − 1) − α ln α is least: f is convex
    (f'' = 2ρ + 1/(α − 1) − 1/α > 0), so f' = 2αρ − ρ − ε + ln(1 − 1/α) is bisected to 0.
    Every α gives a valid bound, so the bisection's precision only affects how tight it is."""
    low, high = 1.0, (epsilon + 1) / (2 * rho) + 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if 2 * mid * rho - rho - epsilon + math.log1p(-1 / mid) < 0 else (low, mid)
    alpha = high
    return (alpha - 1) * (alpha * rho - epsilon) + (alpha - 1) * math.log(alpha - 1) - alpha * math.log(alpha)


def log_delta_bound(sigma: float, epsilon: float, sensitivity: int = 1) -> float:
    """ln of a δ at least the exact δ(ε) of the discrete Gaussian: the exact one
    (:func:`discrete_gaussian_log_delta`) where it can be summed, the zCDP bound elsewhere."""
    try:
        return discrete_gaussian_log_delta(sigma, epsilon, sensitivity)
    except ValueError:
        _check(sigma, epsilon, sensitivity)
        return _zcdp_log_delta(int(sensitivity) ** 2 / (2 * sigma**2), epsilon)


def discrete_gaussian_delta(sigma: float, epsilon: float, sensitivity: int = 1) -> float:
    """δ(ε) of the discrete Gaussian N_Z(0, σ²) on an integer query of sensitivity Δ: the
    smallest δ for which it is (ε, δ)-DP (CKS 2020, Thm 7)."""
    return math.exp(discrete_gaussian_log_delta(sigma, epsilon, sensitivity))


def discrete_gaussian_sigma(epsilon: float, delta: float, sensitivity: int = 1) -> float:
    """A σ with which the discrete Gaussian on an integer query of sensitivity Δ is (ε, δ)-DP,
    exactly (CKS 2020, Thm 7), found by bisection on σ to 1e−12 relative: the returned σ is
    the upper end of the bracket, one whose computed δ was found ≤ δ·(1 − ``CALIBRATION_MARGIN``),
    so that the exact δ is below δ whatever the rounding; every σ the bisection kept below it
    gave more. Where δ cannot be summed, it is bounded through zCDP (module docstring). The
    bracket starts at the continuous Gaussian's σ (Balle & Wang 2018): between 0.55 and
    1.07 times the discrete one's over ε ∈ [0.01, 60], δ ∈ [1e−12, 1e−3]."""
    from privsched.budgets.curves import analytic_gaussian_sigma

    if not epsilon > 0 or not math.isfinite(epsilon) or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({epsilon!r}, {delta!r})")
    delta_int = _check(1.0, epsilon, sensitivity)
    target = math.log(delta) + math.log1p(-CALIBRATION_MARGIN)

    def fits(sigma: float) -> bool:
        return log_delta_bound(sigma, epsilon, delta_int) <= target

    high = analytic_gaussian_sigma(epsilon, delta, float(delta_int))
    low = high
    while not fits(high):
        low, high = high, high * 1.25
    while fits(low):
        high, low = low, low / 1.25
    while high - low > 1e-12 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high
