"""The ranges of numbers privsched accepts, and the checks that enforce them (the pydantic
field types built on these checks are in :mod:`privsched.budgets.fields`).

Each bound keeps the arithmetic that follows it finite and its loops short, and an error
names the bound that was crossed:
- an RDP order α is finite, above 1 and at most ``MAX_ORDER``: the subsampled Gaussian's
  curve at an integer order sums α + 1 terms (MTZ 2019 §3.3; about a quarter of a second at
  10⁶), and every curve and conversion is finite up to there (tests/test_budgets_orders.py);
- a Gaussian curve α Δ²/(2σ²) (Mironov 2017, Prop. 7) stays below 1e30 at α ≤ ``MAX_ORDER``
  when Δ ≤ ``MAX_SENSITIVITY`` and σ ≥ ``MIN_NOISE``; a Laplace curve (Prop. 6) is evaluated
  in log space, and its (α − 1) Δ/b stays finite for b ≥ ``MIN_NOISE``;
- σ = sqrt(2 ln(1.25/δ))/ε (Dwork & Roth 2014, Thm A.1) stays finite for ε ≥ ``MIN_EPSILON``
  and δ ≥ ``MIN_DELTA`` (no subnormal δ);
- a DP-SGD plan has at most ``MAX_STEPS`` noisy steps, so that the noise calibration
  (Opacus' ``get_noise_multiplier``, a doubling then a bisection) ends;
- a person's contribution bound K (rows a person has in any read) is a whole number in
  [1, ``MAX_ROWS_PER_USER``], so that K times a record's sensitivity stays finite;
- booleans are not numbers, and integers are compared exactly (a 400-digit integer is
  refused, never converted to an infinite float).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

MIN_EPSILON, MAX_EPSILON = 1e-6, 1e6
#: Largest RDP order (the OSDI'21 artifact's grid reaches 20,480).
MAX_ORDER = 1e6
#: Smallest positive δ (a subnormal δ has no meaning and loses precision in ln(1/δ)).
MIN_DELTA = 1e-300
MIN_NOISE, MAX_NOISE = 1e-6, 1e12
MIN_SENSITIVITY, MAX_SENSITIVITY = 1e-9, 1e6
MIN_SAMPLE_RATE = 1e-9
#: Largest contribution bound K: rows one person may have in one read.
MAX_ROWS_PER_USER = 10**6
MAX_STEPS = 10**7
#: Largest value of any single entry of a demand vector or curve.
MAX_DEMAND = 1e12
#: Most parts of a composition, and most values of an explicit demand.
MAX_PARTS = 1024


def shown(value: Any, width: int = 40) -> str:
    """``repr(value)``, cut to ``width`` characters."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def check_number(value: Any, what: str, low: float, high: float, *, low_open: bool = False, integer: bool = False) -> float | int:
    """``value`` if it is a real number (not a bool) in [low, high] (or (low, high]); an
    integral value is returned as an ``int`` when ``integer``. Raises ``ValueError``."""
    must = f"{what} must" if what else "must"
    if isinstance(value, str):  # YAML 1.1 reads 1e-8 (no dot) as text
        try:
            value = float(value.strip()) if len(value) <= 64 else value
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{must} be a number, got {shown(value)}")
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{must} be a whole number, got {shown(value)}")
        if isinstance(value, numbers.Integral):
            value = int(value)
        elif math.isfinite(value):
            value = int(float(value))
    elif not isinstance(value, int) and not math.isfinite(float(value)):
        raise ValueError(f"{must} be finite, got {shown(value)}")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        low_text, high_text = (f"{int(low)}", f"{int(high)}") if integer else (f"{low:g}", f"{high:g}")
        raise ValueError(f"{must} be in {bracket}{low_text}, {high_text}], got {shown(value)}")
    return value if integer else float(value)


def check_delta(value: Any, what: str = "") -> float:
    """δ = 0, or MIN_DELTA ≤ δ < 1."""
    delta = check_number(value, what, 0.0, 1.0)
    if delta >= 1 or 0 < delta < MIN_DELTA:
        raise ValueError(f"{what + ' ' if what else ''}must be 0 or in [{MIN_DELTA:g}, 1), got {shown(value)}")
    return float(delta)


def person_sensitivity(record_sensitivity: float, max_rows_per_user: Any) -> float:
    """The sensitivity of a sum of per-record contributions when one person, with at most K
    rows (``max_rows_per_user``), is added or removed: K·Δ, in L1 and in L2 alike, Δ being a
    record's (each of the K rows moves the sum by at most Δ, triangle inequality; a histogram
    moves by at most K in L1, and in L2 by at most K, when all K rows share a bin). This is
    group privacy made exact by bounding contributions (Dwork & Roth 2014, Thm 2.2, for the
    group of a person's K rows; Wilson et al., "Differentially Private SQL with Bounded User
    Contribution", PoPETs 2020, §3). Raises ``ValueError`` for a K that is not a whole
    number in [1, ``MAX_ROWS_PER_USER``]."""
    rows = check_number(max_rows_per_user, "max_rows_per_user", 1, MAX_ROWS_PER_USER, integer=True)
    return rows * float(record_sensitivity)
