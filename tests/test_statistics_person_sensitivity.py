"""Statistics at a person's sensitivity: a person with at most K rows moves every released
quantity K times as far as one record does, and the noise is scaled to match."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import person_sensitivity
from privsched.budgets.mechanisms import EpsilonDelta, Gaussian, Laplace, demand_vector
from privsched.statistics.queries import StatisticJob, statistic_mechanism
from privsched.statistics.release import _exact, dp_statistic

#: Significance of the goodness-of-fit tests: a correct sampler fails one in a million runs.
ALPHA = 1e-6
DRAWS = 4000

jobs = st.one_of(
    st.just(StatisticJob(query="count")),
    st.builds(
        lambda query, lo, width, bins: StatisticJob(
            query=query, column="x", bounds=(lo, lo + width), bins=bins if query == "histogram" else None
        ),
        st.sampled_from(["sum", "mean", "histogram"]),
        st.floats(-1e6, 1e6),
        st.floats(1e-3, 1e6),
        st.integers(1, 50),
    ),
)


@given(jobs, st.integers(1, 10**6))
def test_every_released_part_has_k_times_a_records_sensitivity(job, k):
    record, person = job.parts(), job.parts(max_rows_per_user=k)
    assert [name for name, _ in person] == [name for name, _ in record]
    assert [s for _, s in person] == [k * s for _, s in record]


def test_count_sum_mean_and_histogram_sensitivities_for_five_rows_a_person():
    assert StatisticJob(query="count").parts(5) == [("count", 5.0)]
    assert StatisticJob(query="sum", column="x", bounds=(-3.0, 2.0)).parts(5) == [("sum", 15.0)]
    assert StatisticJob(query="mean", column="x", bounds=(0.0, 4.0)).parts(5) == [("sum", 20.0), ("count", 5.0)]
    assert StatisticJob(query="histogram", column="x", bounds=(0.0, 1.0), bins=4).parts(5) == [("histogram", 5.0)]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 1000), st.floats(0.01, 10.0), st.sampled_from(["laplace", "gaussian"]))
def test_a_person_level_statistic_is_charged_the_records_curve_with_k_times_the_noise(k, epsilon, noise):
    job, rdp = StatisticJob(query="count", noise=noise), Accounting.rdp()
    record = statistic_mechanism(job, epsilon, 1e-6, rdp)
    person = statistic_mechanism(job, epsilon, 1e-6, rdp, max_rows_per_user=k)
    np.testing.assert_allclose(demand_vector(person, rdp), demand_vector(record, rdp), rtol=1e-12)
    if noise == "gaussian":
        assert isinstance(person, Gaussian) and isinstance(record, Gaussian)
        assert person.sensitivity == k and person.sigma == pytest.approx(k * record.sigma, rel=1e-12)
    else:
        assert person == record == EpsilonDelta(epsilon=epsilon, delta=0.0)


def _discrete_laplace_fit(noise: np.ndarray, scale: float) -> float:
    """p-value of a chi-square test that ``noise`` was drawn from the discrete Laplace
    P(k) ∝ exp(−|k|/scale), over bins of at least 20 expected draws (the tails pooled)."""
    r = math.exp(-1 / scale)
    edges = np.arange(-int(8 * scale), int(8 * scale) + 1)
    pmf = (1 - r) / (1 + r) * r ** np.abs(edges)
    tail = r ** (edges[-1] + 1) / (1 + r)  # P(k > last edge) = P(k < first edge)
    expected = np.concatenate([[tail], pmf, [tail]]) * len(noise)
    observed = np.concatenate([[np.sum(noise < edges[0])], [np.sum(noise == e) for e in edges], [np.sum(noise > edges[-1])]])
    # pool neighbouring bins from the outside in until each expects at least 20 draws
    pooled_e, pooled_o, acc_e, acc_o = [], [], 0.0, 0
    for e, o in zip(expected, observed, strict=True):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= 20:
            pooled_e.append(acc_e)
            pooled_o.append(acc_o)
            acc_e, acc_o = 0.0, 0
    pooled_e[-1] += acc_e
    pooled_o[-1] += acc_o
    return float(stats.chisquare(pooled_o, pooled_e).pvalue)


@pytest.fixture(scope="module")
def count_noise_five_rows() -> np.ndarray:
    """Noise of DRAWS counts of 1,000 rows at ε = 1 with K = 5 rows a person."""
    job = StatisticJob(query="count")
    mechanism = statistic_mechanism(job, 1.0, 0.0, Accounting.basic(), max_rows_per_user=5)
    return np.array([dp_statistic(job, mechanism, None, 1000, max_rows_per_user=5)["value"] - 1000 for _ in range(DRAWS)])


def test_a_count_with_five_rows_a_person_is_released_with_laplace_scale_five_over_epsilon(count_noise_five_rows):
    assert np.all(count_noise_five_rows == np.round(count_noise_five_rows))
    assert _discrete_laplace_fit(count_noise_five_rows, 5.0) > ALPHA


@pytest.mark.parametrize("scale", [1.0, 4.0, 6.5])
def test_the_fit_would_tell_another_laplace_scale(count_noise_five_rows, scale):
    assert _discrete_laplace_fit(count_noise_five_rows, scale) < ALPHA


@pytest.mark.parametrize(
    ("noise", "mechanism"),
    [("gaussian", Gaussian(sigma=4.0, sensitivity=1.0)), ("laplace", Laplace(scale=2.0, sensitivity=1.0))],
)
def test_noise_charged_at_a_records_sensitivity_is_not_released_for_a_person_with_five_rows(noise, mechanism):
    job = StatisticJob(query="count", noise=noise)
    assert math.isfinite(dp_statistic(job, mechanism, None, 100)["value"])  # at one record's sensitivity it is released
    with pytest.raises(ValueError, match="loses more privacy than it was charged"):
        dp_statistic(job, mechanism, None, 100, max_rows_per_user=5)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, 10**6 + 1, "five"])
def test_a_contribution_bound_that_is_not_a_whole_number_from_one_is_refused(k):
    with pytest.raises(ValueError, match="max_rows_per_user must"):
        person_sensitivity(1.0, k)


values = st.lists(st.one_of(st.floats(-1e3, 1e3), st.just(math.nan), st.just(math.inf)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(jobs, values, st.integers(1, 8), st.data())
def test_adding_a_persons_rows_moves_each_exact_part_by_at_most_its_sensitivity(job, others, k, data):
    person = data.draw(st.lists(st.one_of(st.floats(-1e7, 1e7), st.just(math.nan)), min_size=1, max_size=k))
    without, with_person = np.array(others, dtype=float), np.array(others + person, dtype=float)
    for name, sensitivity in job.parts(max_rows_per_user=k):
        before, _ = _exact(job, name, without, len(others))
        after, _ = _exact(job, name, with_person, len(others) + len(person))
        change = np.abs(after - before)
        assert change.sum() <= sensitivity * (1 + 1e-9)  # L1, and so L2
