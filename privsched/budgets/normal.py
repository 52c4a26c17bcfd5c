"""The logarithm of the standard normal distribution function, ln Φ(x), in double precision
over the whole real line, from the standard library alone (no SciPy on the submit path).

Φ(x) = ½ erfc(−x/√2). Three ranges, each accurate to a few units in the last place:

- x ≥ −1: ln Φ(x) = log1p(−½ erfc(x/√2)). Near 0 and above, Φ is close to 1 and ``log1p``
  keeps the tiny ln Φ ≈ −Φ(−x) exact where ``log(Φ)`` would round it away; erfc(x/√2) only
  underflows to 0 where ln Φ(x) itself rounds to −0.0. The argument t = x/√2 is rounded
  to t̃, and erfc(t) ~ e^{−t²} turns that rounding into a relative error of 2t²·2⁻⁵³
  (4e−14 at x = 20): the rest r = t − t̃ is found exactly (Dekker's product of x with
  1/√2 held as the sum of two doubles) and erfc(t) = erfc(t̃)·(1 − r·2e^{−t̃²}/(√π erfc(t̃)))
  to first order (d erfc/dt = −2e^{−t²}/√π, A&S 7.1.19), which leaves ~1 ulp.
- −``ASYMPTOTIC_BELOW`` ≤ x < −1: ln Φ(x) = ln(erfc(−x/√2)) − ln 2; here ½ ≤ −ln Φ and the
  logarithm of erfc, which is accurate to an ulp and far from underflow (erfc(z) > 1e−90),
  loses nothing.
- x < −``ASYMPTOTIC_BELOW``: the asymptotic expansion of erfc (Abramowitz & Stegun 7.1.23),
  erfc z ~ e^{−z²}/(z√π) · (1 + Σ_{m≥1} (−1)^m (1·3···(2m−1))/(2z²)^m), with z = −x/√2 is
  ln Φ(x) = −x²/2 − ln(−x) − ½ ln 2π + ln(1 + Σ_{m≥1} (−1)^m (2m−1)!!/x^{2m}).
  At |x| ≥ 20 its terms fall by at least a factor 400/(2m−1) each, and the sum stops at
  the first term below 2⁻⁶⁰ relative, long before the series would diverge (m ≈ x²/2).
"""

from __future__ import annotations

import math

#: Below −ASYMPTOTIC_BELOW, ln Φ comes from the asymptotic series (A&S 7.1.23).
ASYMPTOTIC_BELOW = 20.0

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_LOG_2 = math.log(2.0)
_TINY = 2.0**-60
#: 1/√2 as the sum of two doubles: the nearest double and the rest (to 60 digits, by
#: ``decimal``; tests/test_budgets_normal.py checks it).
_RSQRT2_HIGH = math.sqrt(0.5)
_RSQRT2_LOW = -4.833646656726457e-17
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
#: Veltkamp's splitting constant 2^27 + 1: a double times it splits into two 26-bit halves.
_SPLIT = 134217729.0


def log_ndtr(x: float) -> float:
    """ln Φ(x) for a float x (−inf at −inf and for x below about −1.3e154, where x² overflows;
    NaN for NaN); see the module docstring for the method and its accuracy."""
    if x >= -1.0:
        return math.log1p(-0.5 * _erfc_over_sqrt2(x))
    if x >= -ASYMPTOTIC_BELOW:
        return math.log(math.erfc(-x / math.sqrt(2.0))) - _LOG_2
    if x != x:  # NaN compares false above
        return x
    return -0.5 * x * x - math.log(-x) - _HALF_LOG_2PI + math.log1p(_mills_series(x))


def _erfc_over_sqrt2(x: float) -> float:
    """erfc(x/√2) for x ≥ −1, corrected for the rounding of x/√2 (see the module docstring)."""
    t = x * _RSQRT2_HIGH
    value = math.erfc(t)
    if value < 1e-300:  # subnormal or zero: no relative accuracy left to keep
        return value
    rest = _product_error(x, _RSQRT2_HIGH, t) + x * _RSQRT2_LOW
    return value * (1.0 - rest * _TWO_OVER_SQRT_PI * math.exp(-t * t) / value)


def _product_error(a: float, b: float, product: float) -> float:
    """a·b − fl(a·b) exactly, for ``product`` = fl(a·b) (Dekker 1971, with Veltkamp's split)."""
    a_high = _SPLIT * a - (_SPLIT * a - a)
    a_low = a - a_high
    b_high = _SPLIT * b - (_SPLIT * b - b)
    b_low = b - b_high
    return ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low


def _mills_series(x: float) -> float:
    """Σ_{m≥1} (−1)^m (2m−1)!!/x^{2m} for |x| ≥ 20 (A&S 7.1.23 with 2z² = x²), summed while
    the terms decrease and stop at the first below 2⁻⁶⁰."""
    inverse_square = 1.0 / (x * x)
    term, total, m = 1.0, 0.0, 1
    while True:
        term *= -(2 * m - 1) * inverse_square
        total += term
        if abs(term) < _TINY:
            return total
        m += 1
