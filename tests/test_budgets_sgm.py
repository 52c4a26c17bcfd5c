"""The subsampled-Gaussian RDP curve and noise calibration of ``privsched.budgets.sgm``
against Opacus' RDP accountant, and planning a DP-SGD job without torch."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import warnings

import mpmath
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis.rdp import compute_rdp
from opacus.accountants.utils import get_noise_multiplier

from privsched.budgets import DEFAULT_ALPHAS, calibrate_noise_multiplier, subsampled_gaussian_curve
from privsched.budgets.curves import rdp_to_epsilon
from privsched.budgets.sgm import CALIBRATION_ALPHAS, _epsilon_and_order, subsampled_gaussian_epsilon

from .conftest import REPO

#: Integer and fractional orders: the default grid, Opacus' conversion grid, and extremes.
ORDERS = sorted(set(DEFAULT_ALPHAS) | set(CALIBRATION_ALPHAS) | {1.01, 1.25, 100.0, 256.0})

#: How far apart two evaluations of ln A_α in double precision may lie. Both sum the series
#: term by term in log space near ln A_α ≈ 0, up to thousands of terms for a fractional α;
#: measured against the same truncated series in 40-digit arithmetic (mpmath), Opacus' own
#: ln A_α is off by up to 4e-14 where it is tiny (1e-8 relative at q = 0.5, σ = 20, α = 1.01),
#: and ours by as much: they agree to 1e-10 relative, or to this in ln A_α.
LN_A_ROUNDING = 1e-13


def assert_matches_opacus(curve, expected, orders, steps):
    """ε(α) = steps·ln A_α/(α − 1) within 1e-10 relative or :data:`LN_A_ROUNDING` in ln A_α."""
    atol = steps * LN_A_ROUNDING / (np.asarray(orders, dtype=float) - 1)
    assert np.all(np.abs(np.asarray(curve) - expected) <= np.maximum(1e-10 * np.abs(expected), atol))


@pytest.mark.parametrize(
    ("q", "sigma"),
    list(itertools.product([1e-4, 1e-3, 0.01, 0.05, 0.2, 0.5, 0.9, 0.999, 1.0], [0.3, 0.7, 1.0, 2.0, 5.0, 20.0])),
)
def test_curve_equals_opacus_compute_rdp_at_every_order(q, sigma):
    for steps in (1, 37, 10_000):
        expected = np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=ORDERS))
        assert_matches_opacus(subsampled_gaussian_curve(q, sigma, steps, ORDERS), expected, ORDERS, steps)


@settings(max_examples=30, deadline=None)
@given(
    q=st.floats(1e-5, 1.0),
    sigma=st.floats(0.2, 50.0),
    steps=st.integers(0, 100_000),
    alpha=st.floats(1.001, 200.0) | st.integers(2, 200).map(float),
)
def test_curve_equals_opacus_compute_rdp_anywhere(q, sigma, steps, alpha):
    expected = compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=[alpha])
    assert_matches_opacus(subsampled_gaussian_curve(q, sigma, steps, [alpha]), expected, [alpha], steps)


def exact_log_a(q, sigma, alpha):
    """ln A_α of MTZ 2019 §3.3 in 40-digit arithmetic, the fractional series cut where
    Opacus cuts it (both terms below e^{−30})."""
    with mpmath.workdps(40):
        q, sigma, a = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(alpha)
        if a == mpmath.floor(a):
            return mpmath.log(
                sum(mpmath.binomial(a, k) * q**k * (1 - q) ** (a - k) * mpmath.exp((k * k - k) / (2 * sigma**2)) for k in range(int(a) + 1))
            )
        z0 = sigma**2 * mpmath.log(1 / q - 1) + mpmath.mpf(0.5)
        total, k = mpmath.mpf(0), 0
        while True:
            j = a - k
            s0 = q**k * (1 - q) ** j * mpmath.exp((k * k - k) / (2 * sigma**2)) * mpmath.erfc((k - z0) / (mpmath.sqrt(2) * sigma)) / 2
            s1 = q**j * (1 - q) ** k * mpmath.exp((j * j - j) / (2 * sigma**2)) * mpmath.erfc((z0 - j) / (mpmath.sqrt(2) * sigma)) / 2
            total += mpmath.binomial(a, k) * (s0 + s1)
            if max(abs(mpmath.binomial(a, k) * s0), abs(mpmath.binomial(a, k) * s1)) < math.exp(-30):
                return mpmath.log(total)
            k += 1


@pytest.mark.parametrize(
    ("q", "sigma", "alpha"), [(1e-4, 0.3, 1.1), (1e-3, 0.7, 1.8), (0.05, 1.0, 2.5), (0.05, 1.0, 8.0), (0.5, 2.0, 32.0)]
)
def test_curve_is_the_exact_series_to_rounding(q, sigma, alpha):
    exact = float(exact_log_a(q, sigma, alpha))
    ours = subsampled_gaussian_curve(q, sigma, 1, [alpha])[0] * (alpha - 1)
    assert abs(ours - exact) <= max(1e-10 * abs(exact), LN_A_ROUNDING)


def test_curve_at_orders_in_the_thousands_is_finite_and_grows():
    orders = [300.5, 600.5, 1100.0, 1500.5, 2000.0]  # C(α, k) overflows a double from α ≈ 1030
    curve = subsampled_gaussian_curve(0.01, 5.0, 1, orders)
    assert np.all(np.isfinite(curve)) and np.all(np.diff(curve) > 0)
    assert abs(curve[2] * 1099 - float(exact_log_a(0.01, 5.0, 1100.0))) <= 1e-10 * curve[2] * 1099


def test_curve_grows_with_the_sampling_rate_and_shrinks_with_the_noise():
    base = subsampled_gaussian_curve(0.01, 1.0, 100, DEFAULT_ALPHAS)
    assert np.all(subsampled_gaussian_curve(0.02, 1.0, 100, DEFAULT_ALPHAS) > base)
    assert np.all(subsampled_gaussian_curve(0.01, 1.5, 100, DEFAULT_ALPHAS) < base)


@pytest.mark.parametrize(
    ("q", "steps", "epsilon", "delta"),
    [
        (0.02, 150, 1.0, 1e-6),
        (0.05, 40, 0.5, 1e-9),
        (0.001, 10_000, 5.0, 1e-6),
        (0.2, 10, 3.0, 1e-5),
        (1.0, 5, 2.0, 1e-6),
        (0.01, 10, 1.0, 1e-9),
        (0.1, 300, 8.0, 1e-7),
    ],
)
def test_calibration_is_opacus_get_noise_multiplier(q, steps, epsilon, delta):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = get_noise_multiplier(
            target_epsilon=epsilon, target_delta=delta, sample_rate=q, steps=steps, accountant="rdp", epsilon_tolerance=0.01 * epsilon
        )
    sigma = calibrate_noise_multiplier(q, steps, epsilon, delta)
    assert sigma == expected
    spent = subsampled_gaussian_epsilon(q, sigma, steps, delta)
    assert 0.99 * epsilon <= spent <= epsilon


def whole_curve_epsilon(q, sigma, steps, delta):
    """ε at δ from the curve at every one of Opacus' orders, converted at once."""
    return rdp_to_epsilon(subsampled_gaussian_curve(q, sigma, steps, CALIBRATION_ALPHAS), CALIBRATION_ALPHAS, delta)[0]


def whole_curve_bisection(q, steps, epsilon, delta, tolerance=0.01):
    """Opacus' ``get_noise_multiplier`` search, every ε from the whole curve."""
    low, high, eps_high = 0.0, 10.0, math.inf
    while eps_high > epsilon:
        high = 2 * high
        eps_high = whole_curve_epsilon(q, high, steps, delta)
    while epsilon - eps_high > tolerance * epsilon:
        middle = (low + high) / 2
        eps_middle = whole_curve_epsilon(q, middle, steps, delta)
        high, eps_high, low = (middle, eps_middle, low) if eps_middle < epsilon else (high, eps_high, middle)
    return high


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "delta"),
    list(itertools.product([1e-4, 0.05, 0.9, 1.0], [0.4, 1.5, 30.0], [0, 40, 10_000], [1e-12, 0.1])),
)
def test_epsilon_skipping_orders_is_the_whole_curves_to_the_bit_from_any_starting_order(q, sigma, steps, delta):
    expected = whole_curve_epsilon(q, sigma, steps, delta)
    assert subsampled_gaussian_epsilon(q, sigma, steps, delta) == expected
    for guess in (0, 40, len(CALIBRATION_ALPHAS) - 1):
        epsilon, order = _epsilon_and_order(q, sigma, steps, delta, guess)
        assert epsilon == expected
        alpha = [CALIBRATION_ALPHAS[order]]
        assert rdp_to_epsilon(subsampled_gaussian_curve(q, sigma, steps, alpha), alpha, delta)[0] == expected


@settings(max_examples=40, deadline=None)
@given(
    q=st.floats(1e-5, 1.0),
    sigma=st.floats(0.2, 100.0),
    steps=st.integers(0, 1_000_000),
    delta=st.floats(1e-15, 0.5),
    guess=st.integers(0, len(CALIBRATION_ALPHAS) - 1),
)
def test_epsilon_skipping_orders_is_the_whole_curves_to_the_bit_anywhere(q, sigma, steps, delta, guess):
    assert _epsilon_and_order(q, sigma, steps, delta, guess)[0] == whole_curve_epsilon(q, sigma, steps, delta)


@pytest.mark.parametrize(
    ("q", "steps", "epsilon", "delta"),
    [(0.05, 40, 0.9, 1e-9), (0.001, 3000, 0.3, 1e-6), (0.3, 7, 20.0, 1e-3), (0.01, 100_000, 2.0, 1e-12), (1.0, 3, 1.0, 1e-5)],
)
def test_calibration_is_the_whole_curve_bisection_to_the_bit(q, steps, epsilon, delta):
    assert calibrate_noise_multiplier.__wrapped__(q, steps, epsilon, delta) == whole_curve_bisection(q, steps, epsilon, delta)


@settings(max_examples=25, deadline=None)
@given(q=st.floats(1e-4, 1.0), steps=st.integers(1, 20_000), epsilon=st.floats(0.05, 30.0), delta=st.floats(1e-12, 1e-3))
def test_calibrated_noise_spends_at_most_its_epsilon_and_within_the_tolerance_of_the_least_noise(q, steps, epsilon, delta):
    try:
        sigma = calibrate_noise_multiplier(q, steps, epsilon, delta)
    except ValueError as exc:  # ε below what the largest order allows at this δ, whatever the noise
        assume("no noise level reaches" not in str(exc))
        raise
    spent = whole_curve_epsilon(q, sigma, steps, delta)
    assert 0.99 * epsilon <= spent <= epsilon  # the least σ spends exactly ε: this σ is within 1 % of ε of it


@pytest.mark.parametrize(("epsilon", "delta"), [(0.0, 1e-6), (-1.0, 1e-6), (float("nan"), 1e-6), (1.0, 0.0), (1.0, 1.0)])
def test_calibration_refuses_bad_targets(epsilon, delta):
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(0.01, 100, epsilon, delta)


def test_calibration_refuses_a_budget_no_noise_reaches():
    with pytest.raises(ValueError, match="no noise level reaches"):
        calibrate_noise_multiplier(1.0, 10_000_000, 1e-9, 1e-12)


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "alphas"),
    [
        (0.0, 1.0, 1, [2.0]),
        (1.5, 1.0, 1, [2.0]),
        (0.1, 0.0, 1, [2.0]),
        (0.1, float("inf"), 1, [2.0]),
        (0.1, 1.0, -1, [2.0]),
        (0.1, 1.0, 1.5, [2.0]),
        (0.1, 1.0, 1, [1.0]),
        (0.1, 1.0, 1, [float("inf")]),
    ],
)
def test_curve_refuses_bad_parameters(q, sigma, steps, alphas):
    with pytest.raises(ValueError):
        subsampled_gaussian_curve(q, sigma, steps, alphas)


PLAN_WITHOUT_TORCH = """
import json, sys
from privsched.cli import app
app(sys.argv[1:], standalone_mode=False)
heavy = sorted(m for m in ("torch", "opacus", "ray", "matplotlib", "scipy") if m in sys.modules)
print(json.dumps(heavy))
"""


def test_submitting_a_dpsgd_pipeline_imports_neither_torch_nor_opacus_nor_scipy(tmp_path, run_cli):
    db = tmp_path / "p.db"
    for args in (
        ["init"],
        ["dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7"],
        ["blocks", "add", "reviews", "d1", "d2"],
    ):
        assert run_cli(*args, "--db", db).returncode == 0
    spec = tmp_path / "p.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "p",
                "dataset": "reviews",
                "blocks": {"last": 2},
                "epsilon": 1.0,
                "delta": 1e-9,
                "job": {"kind": "dpsgd", "params": {"model": "mlp", "sample_rate": 0.05, "epochs": 2, "lr": 0.05}},
            }
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", PLAN_WITHOUT_TORCH, "submit", str(spec), "--db", str(db)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []
    listing = run_cli("status", "1", "--db", db)
    assert listing.returncode == 0 and "pending" in listing.stdout
