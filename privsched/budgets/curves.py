"""RDP curves of common mechanisms and conversions to (ε, δ) (docs/design.md §3.4).

Pure NumPy functions over an order grid ``alphas``; each returns an array of ε(α). The
subsampled Gaussian (DP-SGD) has its own module, :mod:`privsched.budgets.sgm`.
"""

from __future__ import annotations

import math

import numpy as np


def _orders(alphas) -> np.ndarray:
    a = np.asarray(alphas, dtype=float)
    if np.any(a <= 1):
        raise ValueError("RDP orders must be greater than 1")
    return a


def gaussian_curve(sigma: float, alphas, sensitivity: float = 1.0) -> np.ndarray:
    """Gaussian mechanism: ε(α) = α Δ² / (2σ²) (Mironov 2017, Prop. 7)."""
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"noise sigma must be positive and finite, got {sigma!r}")
    return _orders(alphas) * sensitivity**2 / (2 * sigma**2)


def laplace_curve(scale: float, alphas, sensitivity: float = 1.0) -> np.ndarray:
    """Laplace mechanism with scale b (Mironov 2017, Prop. 6), for α > 1, with λ = b/Δ:

    ε(α) = 1/(α−1) · ln( α/(2α−1) · e^{(α−1)/λ} + (α−1)/(2α−1) · e^{−α/λ} ).
    Evaluated in log space so that large α/λ does not overflow.
    """
    if not scale > 0 or not math.isfinite(scale):
        raise ValueError(f"Laplace scale must be positive and finite, got {scale!r}")
    a = _orders(alphas)
    lam = scale / sensitivity
    first = np.log(a / (2 * a - 1)) + (a - 1) / lam
    second = np.log((a - 1) / (2 * a - 1)) + (-a / lam)
    return np.logaddexp(first, second) / (a - 1)


def pure_dp_curve(epsilon: float, alphas) -> np.ndarray:
    """RDP curve valid for *every* ε-DP mechanism: ε(α) = min(ε, α ε²/2).

    ε-DP bounds the Rényi divergence of every order by ε (D_α ≤ D_∞), and implies
    (ε²/2)-zCDP, i.e. ε(α) ≤ α ε²/2 (Bun & Steinke 2016, Prop. 3.3)."""
    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}")
    a = _orders(alphas)
    return np.minimum(epsilon, a * epsilon**2 / 2)


def gaussian_sigma(epsilon: float, delta: float) -> float:
    """Classical calibration σ = sqrt(2 ln(1.25/δ)) / ε (Dwork & Roth 2014, Thm A.1).

    An (ε, δ) guarantee only for ε < 1; privsched uses it only to *pick* a σ whose exact
    RDP curve (:func:`gaussian_curve`) is then charged. Under basic accounting use
    :func:`analytic_gaussian_sigma`."""
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({epsilon!r}, {delta!r})")
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Exact δ at which the Gaussian mechanism N(0, σ²) of sensitivity Δ is (ε, δ)-DP
    (Balle & Wang 2018, Thm. 8):

        δ(ε) = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ),

    evaluated in log space (ln Φ of :func:`privsched.budgets.normal.log_ndtr`) so that it
    stays accurate for ε up to 50 and δ down to 1e-300."""
    from privsched.budgets.normal import log_ndtr

    ratio = sensitivity / sigma
    log_first = float(log_ndtr(ratio / 2 - epsilon / ratio))
    log_second = epsilon + float(log_ndtr(-ratio / 2 - epsilon / ratio))
    if log_second >= log_first:
        return 0.0
    return math.exp(log_first) * -math.expm1(log_second - log_first)


#: Relative margin by which the analytic Gaussian calibration undershoots its target δ.
CALIBRATION_MARGIN = 1e-6


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ (to 1e-12 relative) with :func:`gaussian_delta` (σ, ε) ≤ δ(1 − 10⁻⁹): the analytic
    Gaussian mechanism (Balle & Wang 2018, Alg. 1), an (ε, δ) calibration valid for every
    ε > 0. Bisection on σ, whose δ(σ) decreases; the returned σ is the bracket's upper end.

    In floating point δ(σ) is a difference of two close terms, with a relative error of
    about 1e-16 over their log-ratio (7e-14 seen at ε = 0.01), so the bisection aims at
    δ·(1 − ``CALIBRATION_MARGIN``): the exact δ then stays below δ, and the margin only
    ever adds noise."""
    if not epsilon > 0 or not math.isfinite(epsilon) or not 0 < delta < 1:
        raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({epsilon!r}, {delta!r})")
    target = delta * (1 - CALIBRATION_MARGIN)
    low, high = sensitivity * 1e-6, sensitivity
    while gaussian_delta(high, epsilon, sensitivity) > target:
        low, high = high, 2 * high
    while gaussian_delta(low, epsilon, sensitivity) <= target:
        high, low = low, low / 2
    while high - low > 1e-12 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if gaussian_delta(mid, epsilon, sensitivity) <= target else (mid, high)
    return high


def rdp_to_epsilon(curve, alphas, delta: float) -> tuple[float, float]:
    """Smallest ε such that the curve implies (ε, δ)-DP, and the order that achieves it.

    The conversion of Balle et al. 2020 (Thm. 21), the one Opacus' ``get_privacy_spent``
    uses: ε = min_α ε(α) + ln((α − 1)/α) − (ln δ + ln α)/(α − 1), floored at 0. Pure NumPy,
    so reporting a curve never loads torch.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    a = _orders(alphas)
    rdp = np.asarray(curve, dtype=float)
    if rdp.shape != a.shape:
        raise ValueError(f"curve has {rdp.size} values for {a.size} orders")
    eps = rdp + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)
    eps = np.where(np.isnan(eps), np.inf, eps)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])
