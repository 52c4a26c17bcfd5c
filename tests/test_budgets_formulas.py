"""Budget formulas against known values, numerical integration and Opacus (docs/design.md §3.2, §3.4)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad

from privsched.budgets import (
    DEFAULT_ALPHAS,
    Accounting,
    Composed,
    EpsilonDelta,
    Gaussian,
    Laplace,
    analytic_gaussian_sigma,
    demand_vector,
    gaussian_curve,
    gaussian_delta,
    gaussian_sigma,
    laplace_curve,
    parse_mechanism,
    rdp_capacity,
    rdp_to_epsilon,
    subsampled_gaussian_curve,
)

#: Wide order grid, so conversions are not limited by the default grid's edges.
WIDE = np.concatenate([np.linspace(1.05, 10, 120), np.geomspace(10.5, 5000, 200)])
fast = settings(max_examples=25, deadline=None)


def to_epsilon(curve, alphas, delta) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return rdp_to_epsilon(curve, alphas, delta)[0]


@pytest.mark.parametrize(("alpha", "expected"), [(3, 1.941), (4, 4.627), (5, 5.970), (8, 7.697), (64, 9.744)])
def test_paper_capacity_matches_the_published_values(alpha, expected):
    assert rdp_capacity(10.0, 1e-7, [alpha])[0] == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize("alpha", [1.5, 1.75, 2.0, 2.5])
def test_paper_capacity_is_zero_at_small_orders(alpha):
    assert rdp_capacity(10.0, 1e-7, [alpha])[0] == 0.0


def test_tight_conversion_gives_roughly_10_to_16_percent_more_at_orders_4_and_5():
    paper = rdp_capacity(10.0, 1e-7, [4.0, 5.0])
    tight = rdp_capacity(10.0, 1e-7, [4.0, 5.0], "tight")
    gain = tight / paper - 1
    assert np.all((gain > 0.10) & (gain < 0.17))


@fast
@given(st.floats(0.1, 50), st.floats(1e-12, 1e-2))
def test_tight_capacity_is_never_below_the_paper_rule(epsilon, delta):
    assert np.all(rdp_capacity(epsilon, delta, DEFAULT_ALPHAS, "tight") >= rdp_capacity(epsilon, delta, DEFAULT_ALPHAS))


@fast
@given(st.floats(0.5, 20), st.floats(1e-10, 1e-3))
def test_spending_the_whole_paper_capacity_at_one_order_is_epsilon_delta_dp(epsilon, delta):
    """Mironov Prop. 3: an (α, ε_G(α))-RDP mechanism is (ε_G, δ_G)-DP."""
    capacity = rdp_capacity(epsilon, delta, WIDE)
    live = capacity > 0
    if live.any():
        assert to_epsilon(capacity[live], WIDE[live], delta) <= epsilon * (1 + 1e-9)


@fast
@given(st.floats(0.1, 100), st.floats(0.1, 5))
def test_gaussian_curve_is_alpha_over_two_sigma_squared(sigma, sensitivity):
    np.testing.assert_allclose(
        gaussian_curve(sigma, DEFAULT_ALPHAS, sensitivity), np.array(DEFAULT_ALPHAS) * sensitivity**2 / (2 * sigma**2)
    )


def laplace_divergence(alpha: float, b: float) -> float:
    """D_α(Laplace(0, b) ‖ Laplace(1, b)) = 1/(α−1) ln ∫ p^α q^{1−α}, by quadrature."""

    def integrand(x: float) -> float:
        return math.exp(-(alpha * abs(x) + (1 - alpha) * abs(x - 1)) / b) / (2 * b)

    total = sum(quad(integrand, lo, hi)[0] for lo, hi in [(-np.inf, 0), (0, 1), (1, np.inf)])
    return math.log(total) / (alpha - 1)


@fast
@given(st.floats(1.1, 20), st.floats(0.5, 10))
def test_laplace_curve_matches_numerical_integration(alpha, b):
    assert laplace_curve(b, [alpha])[0] == pytest.approx(laplace_divergence(alpha, b), rel=1e-6)


def test_laplace_curve_stays_finite_at_large_orders_and_small_scales():
    curve = laplace_curve(0.01, [64.0, 1000.0])
    assert np.all(np.isfinite(curve)) and np.all(curve <= 100.0)


@pytest.mark.parametrize(("q", "sigma", "steps"), [(0.01, 1.1, 1000), (0.004, 0.8, 2500), (0.1, 2.0, 50)])
def test_subsampled_gaussian_equals_opacus_accountant(q, sigma, steps):
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=q)
    orders = [float(a) for a in DEFAULT_ALPHAS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected, _ = accountant.get_privacy_spent(delta=1e-5, alphas=orders)
    curve = subsampled_gaussian_curve(q, sigma, steps, orders)
    assert to_epsilon(curve, orders, 1e-5) == pytest.approx(expected, rel=1e-9)


@fast
@given(st.floats(0.3, 10), st.integers(1, 50))
def test_full_batch_subsampled_gaussian_is_the_composed_gaussian(sigma, steps):
    np.testing.assert_allclose(
        subsampled_gaussian_curve(1.0, sigma, steps, DEFAULT_ALPHAS), steps * gaussian_curve(sigma, DEFAULT_ALPHAS), rtol=1e-9
    )


@fast
@given(st.floats(0.05, 1.0), st.floats(1e-10, 1e-3))
def test_classical_gaussian_calibration_is_valid_and_not_absurdly_loose_under_rdp(epsilon, delta):
    """σ = sqrt(2 ln(1.25/δ))/ε is (ε, δ)-DP for ε ≤ 1; the RDP conversion of its curve
    confirms it, and gives back at least a third of ε."""
    converted = to_epsilon(gaussian_curve(gaussian_sigma(epsilon, delta), WIDE), WIDE, delta)
    assert epsilon / 3 <= converted <= epsilon


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 1e-5), (1.0, 1e-9), (3.0, 1e-7)])
def test_rdp_calibration_round_trip(epsilon, delta):
    """The σ that bisection on rdp_to_epsilon calibrates to ε converts back to ε, and needs
    less noise than the classical calibration."""
    lo, hi = 1e-2, 1e3
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if to_epsilon(gaussian_curve(mid, WIDE), WIDE, delta) > epsilon:
            lo = mid
        else:
            hi = mid
    assert to_epsilon(gaussian_curve(hi, WIDE), WIDE, delta) == pytest.approx(epsilon, rel=1e-6)
    assert hi < gaussian_sigma(epsilon, delta)


def test_an_epsilon_delta_demand_with_positive_delta_under_rdp_is_refused_with_one_line():
    with pytest.raises(ValueError, match="gaussian, laplace, subsampled_gaussian") as info:
        demand_vector(EpsilonDelta(epsilon=0.5, delta=1e-9), Accounting.rdp())
    assert "\n" not in str(info.value)


def test_a_pure_epsilon_demand_under_rdp_is_min_of_epsilon_and_alpha_epsilon_squared_over_two():
    rdp = Accounting.rdp()
    alphas = np.array(rdp.alphas)
    np.testing.assert_array_equal(demand_vector(EpsilonDelta(epsilon=0.5), rdp), np.minimum(0.5, alphas * 0.125))


def randomized_response_divergence(alpha: float, epsilon: float) -> float:
    """D_α of ε-randomized response, the largest of any ε-DP mechanism's; also the discrete
    Laplace's at shift 1: (1/(α−1)) ln[(e^{ε(α−1)} + e^{−εα}) / (1 + e^{−ε})], summed exactly."""
    p = 1 / (1 + math.exp(-epsilon))
    return math.log(p**alpha * (1 - p) ** (1 - alpha) + (1 - p) ** alpha * p ** (1 - alpha)) / (alpha - 1)


@fast
@given(st.floats(1.1, 64), st.floats(0.01, 5))
def test_the_pure_dp_charge_covers_laplace_and_randomized_response(alpha, epsilon):
    charged = demand_vector(EpsilonDelta(epsilon=epsilon), Accounting.rdp([alpha]))[0]
    assert charged >= laplace_divergence(alpha, 1 / epsilon) * (1 - 1e-9)
    assert charged >= randomized_response_divergence(alpha, epsilon)


def test_the_pure_dp_charge_exceeds_the_continuous_laplace_curve_where_discrete_laplace_does():
    # why a statistic's Laplace noise (discrete, from OpenDP) is charged the pure-DP curve
    assert randomized_response_divergence(2.0, 0.1) > laplace_curve(10.0, [2.0])[0]


def exact_gaussian_delta(sigma: float, epsilon: float) -> float:
    """Balle & Wang 2018 Thm 8 evaluated with 60-digit arithmetic (mpmath), independently
    of scipy's log-space evaluation."""
    import mpmath

    mpmath.mp.dps = 60
    s, e = mpmath.mpf(sigma), mpmath.mpf(epsilon)
    return float(mpmath.ncdf(1 / (2 * s) - e * s) - mpmath.exp(e) * mpmath.ncdf(-1 / (2 * s) - e * s))


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 50), st.floats(1e-12, 1e-2))
def test_analytic_gaussian_exact_delta_never_exceeds_the_charged_delta(epsilon, delta):
    sigma = analytic_gaussian_sigma(epsilon, delta)
    assert exact_gaussian_delta(sigma, epsilon) <= delta
    assert exact_gaussian_delta(sigma * 0.999, epsilon) > delta  # and it is not wasteful


def test_the_classical_calibration_exceeds_its_delta_at_large_epsilon():
    # why basic accounting calibrates Gaussian noise with the analytic mechanism
    assert exact_gaussian_delta(gaussian_sigma(10.0, 1e-5), 10.0) > 1e-5
    assert gaussian_delta(gaussian_sigma(10.0, 1e-5), 10.0) > 1e-5


def test_composed_mechanisms_add_up():
    rdp = Accounting.rdp()
    parts = [Gaussian(sigma=3.0), Laplace(scale=2.0)]
    np.testing.assert_allclose(demand_vector(Composed(parts=parts), rdp), sum(demand_vector(p, rdp) for p in parts))


def test_mechanism_json_round_trips():
    mechanism = parse_mechanism('{"kind": "composed", "parts": [{"kind": "gaussian", "sigma": 2}]}')
    assert isinstance(mechanism, Composed) and mechanism.parts[0] == Gaussian(sigma=2.0)


@pytest.mark.parametrize(
    "text",
    [
        '{"kind": "gaussian", "sigma": -1}',
        '{"kind": "epsilon_delta", "epsilon": 1, "delta": 1.0}',
        '{"kind": "laplace", "scale": 1, "extra": 3}',
        '{"kind": "unknown"}',
        '{"kind": "composed", "parts": []}',
        '{"kind": "subsampled_gaussian", "sample_rate": 1.5, "noise_multiplier": 1, "steps": 3}',
        "not json",
    ],
)
def test_malformed_mechanisms_are_rejected(text):
    with pytest.raises(ValueError, match="invalid mechanism") as caught:
        parse_mechanism(text)
    assert "\n" not in str(caught.value)


def test_mechanisms_without_a_pure_cost_are_refused_under_basic_accounting():
    with pytest.raises(ValueError, match="basic accounting"):
        demand_vector(Gaussian(sigma=1.0), Accounting.basic())


def test_explicit_demand_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="values"):
        demand_vector(parse_mechanism({"kind": "explicit", "values": [1.0]}), Accounting.rdp())


@fast
@given(
    q=st.floats(0.001, 1.0),
    sigma=st.floats(0.5, 10.0),
    steps=st.integers(1, 2000),
    delta=st.floats(1e-10, 1e-3),
)
def test_rdp_to_epsilon_equals_opacus_get_privacy_spent(q, sigma, steps, delta):
    from opacus.accountants.analysis.rdp import get_privacy_spent

    curve = subsampled_gaussian_curve(q, sigma, steps, DEFAULT_ALPHAS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected, best = get_privacy_spent(orders=list(DEFAULT_ALPHAS), rdp=list(curve), delta=delta)
    epsilon, order = rdp_to_epsilon(curve, DEFAULT_ALPHAS, delta)
    assert epsilon == pytest.approx(float(expected), rel=1e-12, abs=1e-12)
    assert order == float(best)


@fast
@given(st.floats(0.5, 20), st.floats(1e-10, 1e-3), st.sampled_from(["paper", "tight"]))
def test_adaptive_capacity_makes_every_order_a_filter_at_delta_over_the_number_of_orders(epsilon, delta, rule):
    """Union bound over the orders: each order α spent up to its capacity is
    (ε_G, δ_G/|A|)-DP, so under adaptive demands the block is (ε_G, δ_G)-DP."""
    adaptive = rdp_capacity(epsilon, delta, WIDE, f"{rule}-adaptive")
    per_order = delta / len(WIDE)
    for alpha, capacity in zip(WIDE, adaptive):
        if capacity > 0:
            assert to_epsilon([capacity], [alpha], per_order) <= epsilon * (1 + 1e-9)
    np.testing.assert_array_equal(adaptive, rdp_capacity(epsilon, per_order, WIDE, rule))
    assert np.all(adaptive <= rdp_capacity(epsilon, delta, WIDE, rule))


def test_a_dataset_can_choose_the_adaptive_capacity_rule(tmp_path):
    from privsched.ledger import Ledger

    with Ledger.init(tmp_path / "l.db") as ledger:
        info = ledger.create_dataset("d", 10.0, 1e-7, "rdp", conversion="paper-adaptive")
        alphas = np.array(info.accounting.alphas)
        np.testing.assert_allclose(info.capacity, np.maximum(0, 10 - np.log(len(alphas) / 1e-7) / (alphas - 1)))
