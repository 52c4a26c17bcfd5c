"""Properties of the budget algebra shared by policies and the ledger (docs/design.md §3.1, §3.3)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from privsched.budgets import DEFAULT_ALPHAS, Accounting, leq


def quanta(values: np.ndarray, up: bool) -> list[int]:
    """Each value in quanta of 10⁻¹², from the definition (docs/design.md §3.3), with the
    standard library only: a decimal of at most twelve digits after the point (its shortest
    repr), within ±8,000, exactly; any other value rounded up (a demand) or down (a budget)."""
    out = []
    for x in np.asarray(values, dtype=float).tolist():
        written = Decimal(repr(x))
        if abs(written) <= 8000 and written == written.quantize(Decimal("1e-12")):
            out.append(int(written * 10**12))
        else:
            scaled = Fraction(x) * 10**12
            out.append(math.ceil(scaled) if up else math.floor(scaled))
    return out


K = len(DEFAULT_ALPHAS)
RDP = Accounting.rdp()
BASIC = Accounting.basic()
budget = st.floats(0.0, 100.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)
signed = st.floats(-100.0, 100.0, allow_nan=False, allow_infinity=False, allow_subnormal=False)
rdp_vectors = arrays(float, K, elements=budget)
rdp_signed = arrays(float, K, elements=signed)
basic_vectors = arrays(float, 2, elements=budget)
fast = settings(max_examples=60, deadline=None)


@fast
@given(rdp_vectors, rdp_signed, rdp_vectors, st.sampled_from([RDP, BASIC]))
def test_a_fitting_demand_still_fits_when_more_is_available_or_less_is_asked(demand, available, extra, mode):
    demand, available, extra = demand[: mode.dims], available[: mode.dims], extra[: mode.dims]
    live = np.ones(mode.dims, dtype=bool)
    if mode.fits(demand, available, live):
        assert mode.fits(demand, available + extra, live)
        assert mode.fits(demand * 0.5, available, live)


@fast
@given(rdp_vectors, rdp_signed, arrays(bool, K))
def test_rdp_fits_iff_some_live_order_fits(demand, available, live):
    need, have = quanta(demand, up=True), quanta(available, up=False)  # exact quanta, from the definition
    expected = any(live[i] and need[i] <= have[i] for i in range(K))
    assert bool(RDP.fits(demand, available, live)) == expected


@fast
@given(basic_vectors, arrays(float, 2, elements=signed))
def test_basic_fits_iff_every_dimension_fits(demand, available):
    need, have = quanta(demand, up=True), quanta(available, up=False)  # exact quanta, from the definition
    expected = all(need[i] <= have[i] for i in range(2))
    assert bool(BASIC.fits(demand, available, np.ones(2, dtype=bool))) == expected


def test_rdp_fits_with_one_order_where_basic_would_refuse():
    demand = np.array([5.0, 1.0])
    available = np.array([1.0, 2.0])
    rdp = Accounting.rdp([2.0, 8.0])
    assert rdp.fits(demand, available, np.array([True, True]))
    assert not rdp.fits(demand, available, np.array([True, False]))
    assert not BASIC.fits(demand, available, np.array([True, True]))


def test_dead_orders_never_count():
    capacity = np.array([0.0, 0.0, 3.0])
    rdp = Accounting.rdp([1.5, 2.0, 4.0])
    assert rdp.live(capacity).tolist() == [False, False, True]
    assert not rdp.is_safe(np.array([0.0, 0.0, 3.5]), capacity)
    assert rdp.is_safe(np.array([9.0, 9.0, 3.0]), capacity)


@fast
@given(rdp_vectors, rdp_vectors)
def test_shares_are_demand_over_capacity_on_live_orders_and_zero_elsewhere(demand, capacity):
    shares = RDP.shares(demand, capacity)
    live = capacity > 0
    with np.errstate(over="ignore"):  # a huge demand over a tiny capacity is an infinite share
        expected = demand[live] / capacity[live]
    np.testing.assert_allclose(shares[live], expected)
    assert np.all(shares[~live] == 0)


@fast
@given(rdp_vectors, st.floats(0.01, 100.0))
def test_shares_scale_linearly_with_the_demand(demand, factor):
    capacity = np.linspace(1.0, 10.0, K)
    np.testing.assert_allclose(RDP.shares(demand * factor, capacity), RDP.shares(demand, capacity) * factor, rtol=1e-12)


@fast
@given(st.floats(1e-12, 1e12), arrays(bool, K), st.sampled_from([RDP, BASIC]))
def test_no_demand_above_capacity_fits_at_any_order_even_by_one_part_in_a_billion(value, live, mode):
    capacity = np.full(mode.dims, value)
    for excess in (np.nextafter(value, np.inf), value * (1 + 1e-9)):
        demand = np.full(mode.dims, excess)
        assert not mode.fits(demand, capacity, live[: mode.dims] | (mode is BASIC))
        assert not leq(excess, value)
    # the safety check of a float *sum* allows its rounding (about 1e-12), never 1e-9
    assert not mode.is_safe(np.full(mode.dims, value * (1 + 1e-9)), capacity)
    assert not leq(np.nan, value)


@fast
@given(rdp_vectors, rdp_vectors)
def test_safety_is_fitting_what_was_given_out_into_capacity(spent, capacity):
    assert bool(RDP.is_safe(spent, capacity)) == bool(RDP.fits(spent, capacity, capacity > 0))


def test_fits_broadcasts_over_pipelines_and_blocks():
    demand = np.ones((3, 4, K))
    available = np.full((4, K), 2.0)
    live = np.ones((4, K), dtype=bool)
    assert RDP.fits(demand, available, live).shape == (3, 4)


def test_accounting_round_trips_through_its_dict():
    for mode in (BASIC, RDP, Accounting.rdp([2.0, 3.0])):
        assert Accounting.from_dict(mode.to_dict()) == mode
