"""The accuracy of noisy counts and histograms: the ε an accuracy needs, and the proven
bounds that decide whether cached releases answer a query."""

from __future__ import annotations

import math

import mpmath
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from privsched.statistics.accuracy import SCALE_SLACK, Source, Term, best_estimate, failure_bound, laplace_epsilon, laplace_tail
from privsched.statistics.noise import laplace_scale, noisy

ALPHAS = st.floats(0.5, 1e4)
BETAS = st.floats(1e-9, 0.5)
BINS = st.integers(1, 1000)
SCALES = st.floats(0.3, 20.0)


@given(alpha=ALPHAS, beta=BETAS, bins=BINS, sensitivity=st.integers(1, 5))
def test_the_calibrated_epsilon_meets_the_accuracy_by_the_union_bound(alpha: float, beta: float, bins: int, sensitivity: int):
    epsilon = laplace_epsilon(alpha, beta, bins, sensitivity)
    assert bins * laplace_tail(laplace_scale(sensitivity, epsilon) * SCALE_SLACK, alpha) <= beta


@given(alpha=ALPHAS, other=ALPHAS, beta=BETAS, beta2=BETAS, bins=BINS, bins2=BINS)
def test_the_calibrated_epsilon_never_falls_when_more_accuracy_or_bins_are_asked(alpha, other, beta, beta2, bins, bins2):
    tight, loose = sorted([alpha, other]), sorted([beta, beta2])
    few, many = sorted([bins, bins2])
    assert laplace_epsilon(tight[0], loose[1], bins) >= laplace_epsilon(tight[1], loose[1], bins)
    assert laplace_epsilon(alpha, loose[0], bins) >= laplace_epsilon(alpha, loose[1], bins)
    assert laplace_epsilon(alpha, beta, many) >= laplace_epsilon(alpha, beta, few)


@settings(max_examples=50)
@given(scale=SCALES, alpha=st.floats(0.0, 60.0))
def test_the_discrete_laplace_tail_is_the_mass_beyond_alpha(scale: float, alpha: float):
    with mpmath.workdps(150):
        p = mpmath.exp(-1 / mpmath.mpf(scale))
        outside = float(1 - sum((1 - p) / (1 + p) * p ** abs(k) for k in range(-math.floor(alpha), math.floor(alpha) + 1)))
    assert outside <= laplace_tail(scale, alpha) <= outside * (1 + 1e-9)


def discrete_laplace_sum_tail(scale: float, count: int, alpha: float) -> float:
    """P(|X_1 + ... + X_count| > alpha) for i.i.d. discrete Laplace, by convolving the pmf
    on [−K, K] and adding the mass left out (an upper bound on the exact tail)."""
    p = math.exp(-1 / scale)
    reach = int(60 * scale) + 1
    pmf = (1 - p) / (1 + p) * p ** np.abs(np.arange(-reach, reach + 1))
    left_out = count * 2 * p ** (reach + 1) / (1 + p)
    total = np.array([1.0])
    for _ in range(count):
        total = np.convolve(total, pmf)
    support = np.arange(len(total)) - count * reach
    return float(total[np.abs(support) > alpha].sum()) + left_out


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(0.3, 5.0), count=st.integers(1, 4), alpha=st.floats(1.0, 60.0))
def test_the_chernoff_bound_of_a_sum_of_discrete_laplace_is_above_its_exact_tail(scale: float, count: int, alpha: float):
    exact = discrete_laplace_sum_tail(scale, count, alpha)
    assert failure_bound([Term("laplace", scale, 1.0, count)], alpha) >= exact - 1e-12
    assert failure_bound([Term("laplace", scale, 1.0)] * count, alpha) >= exact - 1e-12


def test_cached_answers_from_real_releases_miss_their_accuracy_no_more_often_than_their_bound():
    """Two real 8-bin releases (OpenDP's discrete Laplace), answered as a 4-bin histogram
    and as a count by :func:`best_estimate`. Over 300 rounds the misses exceed the
    binomial quantile of the proven failure bound with probability at most 1e-6 each."""
    exact = np.array([40, 3, 17, 0, 25, 61, 9, 30])
    scales, rounds = (2.0, 3.0), 300
    misses = {"histogram": 0, "count": 0}
    bounds = {}
    for _ in range(rounds):
        releases = [noisy(exact, "laplace", b, integer=True) for b in scales]
        histograms = [Source(r.reshape(4, 2).sum(axis=1), 2, "laplace", b) for r, b in zip(releases, scales)]
        counts = [Source(np.array([r.sum()]), 8, "laplace", b) for r, b in zip(releases, scales)]
        for name, sources, alpha, truth in (
            ("histogram", histograms, 12.0, exact.reshape(4, 2).sum(axis=1)),
            ("count", counts, 18.0, np.array([exact.sum()])),
        ):
            estimate = best_estimate(sources, alpha)
            assert estimate is not None
            bounds[name] = estimate.failure
            misses[name] += bool(np.any(np.abs(estimate.values - truth) > alpha))
    for name in misses:
        assert 0.0 < bounds[name] < 0.5
        assert misses[name] <= binom.isf(1e-6, rounds, bounds[name]), (name, misses[name], bounds[name])


def test_the_inverse_variance_mean_is_chosen_when_it_proves_more():
    sources = [Source(np.array([10.0]), 4, "laplace", 2.0), Source(np.array([14.0]), 4, "laplace", 2.0)]
    estimate = best_estimate(sources, 20.0)
    assert estimate is not None and estimate.used == [0, 1] and estimate.values.tolist() == [12.0]
    assert estimate.failure < min(best_estimate([s], 20.0).failure for s in sources)  # type: ignore[union-attr]
