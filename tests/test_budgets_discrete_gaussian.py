"""The discrete Gaussian's exact (ε, δ) (Canonne, Kamath & Steinke 2020, Thm 7) against
high-precision sums (mpmath), and the σ calibrated on it."""

from __future__ import annotations

import math

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets import EpsilonDelta, Gaussian, analytic_gaussian_sigma
from privsched.budgets.discrete_gaussian import (
    MAX_TERMS,
    discrete_gaussian_delta,
    discrete_gaussian_log_delta,
    discrete_gaussian_sigma,
    log_delta_bound,
)
from privsched.statistics.queries import StatisticJob
from privsched.statistics.release import check_exact_delta, dp_statistic, noise_of


def _terms(sigma: float, start: int) -> range:
    """Integers from ``start`` to 15σ past the larger of start and 0: the rest of any sum
    below is under e^{−112} of its largest term."""
    return range(start, max(start, 0) + int(15 * sigma) + 10)


def exact_delta(sigma: float, epsilon: float, sensitivity: int = 1) -> mpmath.mpf:
    """Thm 7's δ = P[Y > εσ²/Δ − Δ/2] − e^ε P[Y > εσ²/Δ + Δ/2], Y ~ N_Z(0, σ²), as the
    two tails summed apart in 40-digit arithmetic, independently of the paired sum."""
    mpmath.mp.dps = 40
    two_var, eps, d = 2 * mpmath.mpf(sigma) ** 2, mpmath.mpf(epsilon), sensitivity
    t = eps * two_var / (2 * d) - mpmath.mpf(d) / 2
    mass = lambda z: mpmath.exp(-(mpmath.mpf(z) ** 2) / two_var)  # noqa: E731
    normaliser = 1 + 2 * mpmath.fsum(mass(z) for z in _terms(sigma, 1))
    first = int(mpmath.floor(t)) + 1
    second = int(mpmath.floor(t + d)) + 1
    above_t = mpmath.fsum(mass(u) for u in _terms(sigma, first))
    above_t_plus_d = mpmath.fsum(mass(u) for u in _terms(sigma, second))
    return (above_t - mpmath.exp(eps) * above_t_plus_d) / normaliser


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 60), st.floats(1e-12, 1e-3), st.sampled_from([1, 1, 2, 5]))
def test_the_calibrated_sigma_keeps_the_exact_delta_within_the_charge(epsilon, delta, sensitivity):
    sigma = discrete_gaussian_sigma(epsilon, delta, sensitivity)
    assert exact_delta(sigma, epsilon, sensitivity) <= delta


@settings(max_examples=25, deadline=None)
@given(st.floats(0.01, 60), st.floats(1e-12, 1e-3))
def test_the_calibrated_sigma_is_not_wasteful(epsilon, delta):
    sigma = discrete_gaussian_sigma(epsilon, delta)
    assert exact_delta(sigma * (1 - 1e-4), epsilon) > delta


@settings(max_examples=40, deadline=None)
@given(st.floats(0.05, 300), st.floats(0.0, 60), st.sampled_from([1, 2, 3]))
def test_the_computed_delta_matches_a_high_precision_sum(sigma, epsilon, sensitivity):
    reference = exact_delta(sigma, epsilon, sensitivity)
    if reference < mpmath.mpf("1e-290"):
        assert discrete_gaussian_delta(sigma, epsilon, sensitivity) < 1e-280
    else:
        assert discrete_gaussian_delta(sigma, epsilon, sensitivity) == pytest.approx(float(reference), rel=1e-10)


def test_the_continuous_calibration_exceeds_the_discrete_gaussians_delta():
    # why counts and histograms are calibrated on the discrete Gaussian's own guarantee
    sigma = analytic_gaussian_sigma(53.0, 1e-9)
    assert exact_delta(sigma, 53.0) > 7 * 1e-9
    assert discrete_gaussian_delta(sigma, 53.0) > 7 * 1e-9


@pytest.mark.parametrize("alpha", [1.5, 2.0, 3.0, 4.5, 16.0])
@pytest.mark.parametrize("sigma", [0.3, 0.7, 1.0, 2.5, 10.0])
def test_the_discrete_gaussians_renyi_divergence_is_at_most_the_continuous_curve(alpha, sigma):
    # what RDP accounting charges a discrete Gaussian: α Δ²/(2σ²), the continuous curve
    mpmath.mp.dps = 40
    two_var, a = 2 * mpmath.mpf(sigma) ** 2, mpmath.mpf(alpha)
    log_mass = lambda z: -(mpmath.mpf(z) ** 2) / two_var  # noqa: E731
    reach = range(-int(40 * sigma) - 10, int(40 * sigma) + 10)
    log_normaliser = mpmath.log(mpmath.fsum(mpmath.exp(log_mass(z)) for z in reach))
    moment = mpmath.fsum(mpmath.exp(a * log_mass(y) + (1 - a) * log_mass(y - 1) - log_normaliser) for y in reach)
    divergence = mpmath.log(moment) / (a - 1)
    assert divergence <= a / two_var * (1 + mpmath.mpf("1e-35"))  # equal to 40 digits from σ ≈ 2 on


@settings(max_examples=20, deadline=None)
@given(st.floats(1.0, 200), st.floats(0.001, 5))
def test_the_zcdp_bound_used_past_the_summable_range_is_above_the_exact_delta(sigma, epsilon):
    from privsched.budgets.discrete_gaussian import _zcdp_log_delta

    assert math.exp(_zcdp_log_delta(1 / (2 * sigma**2), epsilon)) >= float(exact_delta(sigma, epsilon))


def test_a_sigma_too_large_to_sum_is_calibrated_on_the_zcdp_bound():
    with pytest.raises(ValueError, match="terms"):
        discrete_gaussian_log_delta(1e7, 1e-6)
    sigma = discrete_gaussian_sigma(1e-6, 1e-6)
    assert 2 * math.sqrt(45 * 2 * sigma**2) > MAX_TERMS
    assert log_delta_bound(sigma, 1e-6) <= math.log(1e-6)
    assert sigma >= analytic_gaussian_sigma(1e-6, 1e-6)


@pytest.mark.parametrize(("sigma", "epsilon"), [(5e4, 1e6), (3e4, 1e4), (1e3, 1e6)])
def test_a_delta_out_of_summable_range_is_bounded_not_miscomputed(sigma, epsilon):
    bound = log_delta_bound(sigma, epsilon)
    assert bound < math.log(1e-300)
    assert bound >= float(mpmath.log(exact_delta_far(sigma, epsilon)))


def exact_delta_far(sigma: float, epsilon: float) -> mpmath.mpf:
    """Thm 7's δ for Δ = 1 far in the tail: the first 40 terms of the paired sum (each
    ≥ 0), over 1 + 2Σ (a bound of the normaliser from above), so below the exact δ."""
    mpmath.mp.dps = 60
    two_var, eps = 2 * mpmath.mpf(sigma) ** 2, mpmath.mpf(epsilon)
    first = int(mpmath.floor(eps * two_var / 2 - mpmath.mpf(1) / 2)) + 1
    normaliser = mpmath.sqrt(mpmath.pi * two_var) + 1
    terms = (mpmath.exp(-(mpmath.mpf(u) ** 2) / two_var) * -mpmath.expm1(eps - (2 * u + 1) / two_var) for u in range(first, first + 40))
    return mpmath.fsum(terms) / normaliser


def test_a_count_under_basic_accounting_draws_the_discrete_gaussians_calibrated_sigma():
    part = EpsilonDelta(epsilon=53.0, delta=1e-9)
    kind, scale = noise_of(part, 1.0, integer=True)
    assert (kind, scale) == ("gaussian", discrete_gaussian_sigma(53.0, 1e-9, 1))
    assert exact_delta(scale, 53.0) <= 1e-9
    assert noise_of(part, 1.0)[1] == analytic_gaussian_sigma(53.0, 1e-9)  # a float sum: the continuous one
    value = dp_statistic(StatisticJob(query="count", noise="gaussian"), part, None, 1000)["value"]
    assert value == int(value)


def test_discrete_noise_above_its_charged_delta_is_refused_before_release():
    part = EpsilonDelta(epsilon=53.0, delta=1e-9)
    with pytest.raises(ValueError, match="not"):
        check_exact_delta(part, "gaussian", analytic_gaussian_sigma(53.0, 1e-9), True, 1.0)
    check_exact_delta(part, "gaussian", discrete_gaussian_sigma(53.0, 1e-9), True, 1.0)
    check_exact_delta(Gaussian(sigma=0.01), "gaussian", 0.01, True, 1.0)  # an RDP charge: its curve holds
