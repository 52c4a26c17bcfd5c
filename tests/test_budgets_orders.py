"""RDP orders up to 10⁶ (the OSDI'21 artifact's grid reaches 20,480): accepted wherever a grid
is given, and every curve, capacity and conversion finite, non-negative and, where theory
says so, non-decreasing in α there."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets import (
    DEFAULT_ALPHAS,
    Accounting,
    gaussian_curve,
    laplace_curve,
    pure_dp_curve,
    rdp_capacity,
    rdp_to_epsilon,
    subsampled_gaussian_curve,
)
from privsched.budgets.bounds import MAX_ORDER
from privsched.ledger import Ledger, LedgerError
from privsched.simulation.api import simulate
from privsched.simulation.trace import TraceError, parse_trace

#: The default grid, then the large orders of the published artifact's grid, then 10⁶.
LARGE = (*DEFAULT_ALPHAS, 128.0, 256.0, 1024.0, 20480.0, 1e6)
#: Orders between 1 and 10⁶, integer and fractional, in increasing order.
SPREAD = (1.01, 1.5, 2.0, 3.5, 64.0, 999.5, 1000.0, 1000.5, 1001.0, 4096.5, 20480.0, 20480.5, 123456.0, 1e6)
#: A Gaussian, a Laplace, a subsampled Gaussian and a pure-ε demand, as a trace names them.
MECHANISMS = (
    {"kind": "gaussian", "sigma": 3.0},
    {"kind": "laplace", "scale": 2.0},
    {"kind": "subsampled_gaussian", "sample_rate": 0.01, "noise_multiplier": 1.1, "steps": 1000},
    {"kind": "epsilon_delta", "epsilon": 0.5},
)


def _trace(alphas) -> dict:
    return {
        "accounting": "rdp",
        "alphas": list(alphas),
        "blocks": [{"id": "b", "epsilon": 10.0, "delta": 1e-7}],
        "pipelines": [{"id": f"p{i}", "arrival": i, "blocks": ["b"], "mechanism": m} for i, m in enumerate(MECHANISMS)],
    }


def test_a_trace_with_orders_up_to_a_million_is_accepted_and_simulated():
    trace = parse_trace(_trace(LARGE))
    demand = trace.instance.edge_demand
    assert demand.shape == (len(MECHANISMS), len(LARGE)) and np.all(np.isfinite(demand)) and np.all(demand > 0)
    assert simulate(trace, "fcfs").granted == len(MECHANISMS)


@pytest.mark.parametrize("order", [1.0, 0.5, 1e6 * (1 + 1e-15), 1e300])
def test_a_trace_order_outside_one_to_a_million_is_one_clear_error(order):
    with pytest.raises(TraceError, match=r"alphas\.\d+: must be in \(1, 1e\+06\]"):
        parse_trace(_trace((2.0, order) if order > 2 else (order, 2.0)))


def test_a_dataset_accepts_orders_up_to_a_million(tmp_path):
    with Ledger(tmp_path / "db.sqlite", create=True) as ledger:
        info = ledger.create_dataset("big", 10.0, 1e-7, accounting="rdp", alphas=LARGE)
    assert info.accounting.alphas == LARGE
    assert np.all(np.isfinite(info.capacity)) and info.capacity[-1] > info.capacity[-2] > 9.99


@pytest.mark.parametrize("order", [1e6 * (1 + 1e-15), math.inf, math.nan, 1.0])
def test_a_dataset_refuses_an_order_outside_one_to_a_million(tmp_path, order):
    with Ledger(tmp_path / "db.sqlite", create=True) as ledger:
        with pytest.raises(LedgerError, match="RDP orders must be finite, greater than 1 and at most 1e\\+06"):
            ledger.create_dataset("big", 10.0, 1e-7, accounting="rdp", alphas=[2.0, order] if order > 2 else [order, 2.0])
        assert ledger.list_datasets() == []


def _non_decreasing(curve) -> bool:
    curve = np.asarray(curve)
    return bool(np.all(np.isfinite(curve)) and np.all(curve >= 0) and np.all(np.diff(curve) >= 0))


@settings(max_examples=25, deadline=None)
@given(st.floats(1e-3, 1e3), st.floats(1e-3, 1e3))
def test_the_gaussian_laplace_and_pure_dp_curves_are_finite_and_non_decreasing_up_to_a_million(noise, epsilon):
    # Rényi divergence does not decrease with the order (van Erven & Harremoës 2014, Thm 3)
    assert _non_decreasing(gaussian_curve(noise, SPREAD))
    assert _non_decreasing(laplace_curve(noise, SPREAD))
    assert _non_decreasing(pure_dp_curve(epsilon, SPREAD))
    assert laplace_curve(noise, SPREAD)[-1] <= 1 / noise  # ε-DP at ε = Δ/b bounds every order


@settings(max_examples=8, deadline=None)
@given(st.floats(1e-6, 1.0), st.floats(0.3, 20.0), st.integers(1, 10**5))
def test_the_subsampled_gaussian_curve_is_finite_and_non_decreasing_up_to_a_million(q, sigma, steps):
    assert _non_decreasing(subsampled_gaussian_curve(q, sigma, steps, SPREAD))


@pytest.mark.parametrize(("q", "sigma", "alpha"), [(0.01, 1.0, 1500), (0.2, 5.0, 3000), (1e-4, 0.5, 2048)])
def test_the_subsampled_gaussian_at_a_large_integer_order_is_the_binomial_sum_rounded_up(q, sigma, alpha):
    # above 1000 the coefficients come from ln Γ (Opacus' own terms are NaN there)
    with mpmath.workdps(40):
        qq, s2 = mpmath.mpf(q), 2 * mpmath.mpf(sigma) ** 2
        terms = (mpmath.binomial(alpha, k) * qq**k * (1 - qq) ** (alpha - k) * mpmath.exp((k * k - k) / s2) for k in range(alpha + 1))
        exact = float(mpmath.log(mpmath.fsum(terms)) / (alpha - 1))
    ours = subsampled_gaussian_curve(q, sigma, 1, [float(alpha)])[0]
    assert exact <= ours <= exact * (1 + 1e-11)


def test_a_large_fractional_order_is_charged_at_the_next_integer_order():
    assert subsampled_gaussian_curve(0.01, 1.0, 10, [20480.5]) == subsampled_gaussian_curve(0.01, 1.0, 10, [20481.0])


@settings(max_examples=25, deadline=None)
@given(st.floats(0.1, 100), st.floats(1e-12, 1e-3))
def test_capacities_are_finite_and_non_negative_up_to_a_million(epsilon, delta):
    paper = rdp_capacity(epsilon, delta, SPREAD, "paper")
    assert _non_decreasing(paper)  # ε_G − ln(1/δ_G)/(α − 1) grows with α
    for rule in ("tight", "paper-adaptive", "tight-adaptive"):
        capacity = rdp_capacity(epsilon, delta, SPREAD, rule)  # type: ignore[arg-type]
        assert np.all(np.isfinite(capacity)) and np.all(capacity >= 0)
    assert np.all(rdp_capacity(epsilon, delta, SPREAD, "tight") >= paper)


@settings(max_examples=25, deadline=None)
@given(st.floats(0.05, 50), st.floats(1e-12, 1e-3))
def test_converting_a_curve_over_orders_up_to_a_million_is_finite_and_never_above_the_smaller_grid(sigma, delta):
    small = rdp_to_epsilon(gaussian_curve(sigma, DEFAULT_ALPHAS), DEFAULT_ALPHAS, delta)[0]
    large = rdp_to_epsilon(gaussian_curve(sigma, LARGE), LARGE, delta)[0]
    assert math.isfinite(large) and 0 <= large <= small


def test_an_order_of_exactly_the_largest_is_accepted_and_one_above_it_refused():
    assert Accounting.rdp([2.0, MAX_ORDER]).alphas == (2.0, 1e6)
    with pytest.raises(ValueError, match="at most 1e\\+06"):
        Accounting.rdp([2.0, math.nextafter(MAX_ORDER, math.inf)])
