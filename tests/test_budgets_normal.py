"""ln Φ of ``privsched.budgets.normal`` against SciPy's ``log_ndtr`` and against the value
in 40-digit arithmetic (mpmath), over the whole real line."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import mpmath
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from privsched.budgets import normal
from privsched.budgets.normal import log_ndtr

#: Where SciPy's own ``log_ndtr`` is accurate to a few ulp: above it, its erfc's relative
#: error grows to 6e-14 at x = 20 (measured against mpmath), so the tail is checked against
#: mpmath alone.
SCIPY_ACCURATE_UP_TO = 5.0


def exact_log_ndtr(x: float) -> float:
    """ln Φ(x) in 40-digit arithmetic, rounded once to a double."""
    with mpmath.workdps(40):
        value = mpmath.mpf(x)
        if value > 0:
            return float(mpmath.log1p(-mpmath.ncdf(-value)))
        return float(mpmath.log(mpmath.ncdf(value)))


def relative_error(actual: float, expected: float) -> float:
    return 0.0 if actual == expected else abs(actual - expected) / abs(expected)


@settings(max_examples=300, deadline=None)
@given(x=st.floats(-1e160, SCIPY_ACCURATE_UP_TO))
def test_log_ndtr_equals_scipy_to_1e_14_relative(x):
    assert relative_error(log_ndtr(x), float(special.log_ndtr(x))) <= 1e-14


@settings(max_examples=200, deadline=None)
@given(x=st.floats(-1e6, 37.0) | st.floats(-30.0, -10.0) | st.floats(-1.5, 1.5))
def test_log_ndtr_is_accurate_to_1e_15_relative_anywhere(x):
    assert relative_error(log_ndtr(x), exact_log_ndtr(x)) <= 1e-15


def test_log_ndtr_at_the_ends_of_the_line():
    assert log_ndtr(math.inf) == 0.0 and log_ndtr(40.0) == 0.0
    assert log_ndtr(-math.inf) == -math.inf and log_ndtr(-1e200) == -math.inf
    assert math.isnan(log_ndtr(math.nan))
    assert log_ndtr(0.0) == log_ndtr(-0.0) == -math.log(2)


def test_log_ndtr_is_accurate_on_both_sides_of_where_its_method_changes():
    for edge in (-1.0, -normal.ASYMPTOTIC_BELOW):
        for x in (math.nextafter(edge, -math.inf), edge, math.nextafter(edge, math.inf)):
            assert relative_error(log_ndtr(x), exact_log_ndtr(x)) <= 1e-15


def test_the_low_half_of_one_over_root_two_is_what_remains():
    with localcontext() as context:
        context.prec = 60
        rest = Decimal(1) / Decimal(2).sqrt() - Decimal(normal._RSQRT2_HIGH)
    assert normal._RSQRT2_LOW == float(rest)
