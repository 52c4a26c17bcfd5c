"""Elastic demands: the ε range of a spec, the least fraction it accepts, the ledger's
grants of a fraction of a demand, and calibration to such a grant (docs/design.md §10)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets import Accounting, demand_vector
from privsched.budgets.curves import gaussian_curve, laplace_curve
from privsched.budgets.elastic import calibrate, granted_amount, granted_epsilon, minimum_fraction
from privsched.budgets.exact import on_grid, quantize, units
from privsched.budgets.sgm import subsampled_gaussian_curve
from privsched.jobs.context import BlockGrant, JobContext
from privsched.ledger import Ledger, LedgerError
from privsched.ledger.models import PipelineRequest
from privsched.spec import PipelineSpec, SpecError
from privsched.trainers.builtin import granted_mechanism, plan_mechanism

RDP = Accounting.rdp()
ALPHAS = np.asarray(RDP.alphas)
EVERY = np.ones(len(ALPHAS), dtype=bool)
epsilons = st.floats(1e-3, 50.0, allow_nan=False)


def spec(epsilon: object) -> dict:
    return {"name": "p", "dataset": "d", "blocks": ["b"], "epsilon": epsilon, "job": {"function": "m:f"}}


@given(epsilons, epsilons)
def test_an_epsilon_range_parses_to_its_min_and_max_or_is_refused_in_one_line(a, b):
    if a > b:
        with pytest.raises(SpecError, match="is empty: its min is above its max") as caught:
            PipelineSpec.parse(spec([a, b]))
        assert "\n" not in str(caught.value)
        return
    parsed = PipelineSpec.parse(spec([a, b]))
    assert (parsed.epsilon_min, parsed.epsilon_max, parsed.elastic) == (a, b, a < b)
    assert PipelineSpec.parse(parsed.to_dict()) == parsed


@pytest.mark.parametrize(
    ("epsilon", "message"),
    [
        ([0.0, 1.0], "each end of the range must be in"),
        ([-1, 2], "each end of the range must be in"),
        ([1.0], "got 1 values"),
        ([1, 2, 3], "got 3 values"),
    ],
)
def test_a_bad_epsilon_range_is_one_clear_line(epsilon, message):
    with pytest.raises(SpecError, match=message) as caught:
        PipelineSpec.parse(spec(epsilon))
    assert "\n" not in str(caught.value)


def check_least_fraction(least: np.ndarray, most: np.ndarray) -> None:
    """f · most ≥ least at every order, and no f smaller by a billionth holds."""
    fraction = minimum_fraction(least, most, EVERY)
    assert 0 < fraction <= 1
    assert np.all(fraction * most >= least)
    if fraction < 1:
        assert np.any(fraction * (1 - 1e-9) * most < least)


@given(st.floats(0.05, 50.0), st.floats(1.0, 20.0))
def test_the_least_fraction_of_a_laplace_range_holds_its_min_curve(scale, wider):
    check_least_fraction(laplace_curve(scale * wider, ALPHAS), laplace_curve(scale, ALPHAS))


@given(st.floats(0.3, 50.0), st.floats(1.0, 20.0))
def test_the_least_fraction_of_a_gaussian_range_holds_its_min_curve(sigma, wider):
    check_least_fraction(gaussian_curve(sigma * wider, ALPHAS), gaussian_curve(sigma, ALPHAS))


@settings(max_examples=25)
@given(st.floats(0.001, 0.2), st.floats(0.6, 5.0), st.floats(1.0, 4.0), st.integers(1, 2000))
def test_the_least_fraction_of_a_subsampled_gaussian_range_holds_its_min_curve(rate, sigma, wider, steps):
    most = subsampled_gaussian_curve(rate, sigma, steps, ALPHAS)
    check_least_fraction(subsampled_gaussian_curve(rate, sigma * wider, steps, ALPHAS), most)


def test_a_range_whose_min_costs_more_than_its_max_has_no_least_fraction():
    with pytest.raises(ValueError, match="costs more"):
        minimum_fraction(gaussian_curve(1.0, ALPHAS), gaussian_curve(2.0, ALPHAS), EVERY)


@given(st.floats(1e-6, 1.0), st.lists(st.floats(1e-6, 100.0), min_size=12, max_size=12))
def test_a_granted_fraction_is_on_the_quantum_grid_at_least_f_times_the_demand_and_at_most_the_demand(fraction, values):
    demand = quantize(np.array(values), up=True)  # as the ledger keeps a demand
    granted = granted_amount(demand, fraction)
    assert np.all(granted >= fraction * demand) and np.all(granted <= demand) and on_grid(granted)


@given(st.floats(0.01, 1.0), st.floats(0.05, 5.0), st.floats(1.0, 8.0))
def test_calibration_finds_an_epsilon_in_the_range_whose_curve_fits_the_grant(fraction, low, wider):
    high = low * wider
    grant = granted_amount(demand_vector(plan_epsilon(high), RDP), fraction)
    least = demand_vector(plan_epsilon(low), RDP)
    if not np.all(least <= grant):
        with pytest.raises(ValueError, match="does not hold"):
            granted_epsilon(grant, low, high, 0.0, RDP)
        return
    epsilon = granted_epsilon(grant, low, high, 0.0, RDP)
    assert low <= epsilon <= high
    assert np.all(demand_vector(plan_epsilon(epsilon), RDP) <= grant)


def plan_epsilon(epsilon: float):
    from privsched.budgets.mechanisms import EpsilonDelta

    return EpsilonDelta(epsilon=epsilon)


def test_a_dpsgd_job_granted_part_of_its_range_trains_at_the_largest_epsilon_its_grant_holds():
    job = {"kind": "dpsgd", "model": "logreg", "sample_rate": 0.01, "epochs": 1, "lr": 0.5}
    most, least = (plan_mechanism(job, e, 1e-6, RDP) for e in (4.0, 1.0))
    fraction = minimum_fraction(demand_vector(least, RDP), demand_vector(most, RDP), EVERY)
    grant = granted_amount(demand_vector(most, RDP), (fraction + 1) / 2)
    ctx = JobContext(1, "p", "d", RDP, 1e-6, {"b": BlockGrant("b", None, grant)}, params=job, plan=most, epsilon=4.0, epsilon_min=1.0)
    epsilon, mechanism = granted_mechanism(ctx)
    assert 1.0 < epsilon < 4.0
    assert np.all(demand_vector(mechanism, RDP) <= grant)
    assert mechanism.parts[0].noise_multiplier > most.parts[0].noise_multiplier > 0


def test_calibration_takes_the_whole_plan_when_the_grant_holds_it():
    grant = demand_vector(plan_epsilon(2.0), RDP)
    assert calibrate(plan_epsilon, lambda m: demand_vector(m, RDP), 0.5, 2.0, grant)[0] == 2.0


@pytest.fixture
def ledger(tmp_path: Path):
    with Ledger(tmp_path / "l.db", create=True) as ledger:
        ledger.create_dataset("d", epsilon=10.0, delta=1e-6, accounting="rdp")
        ledger.add_blocks("d", ["b"], unlocked_fraction=1.0)
        yield ledger


def elastic(ledger: Ledger, least: float | None, epsilon: float = 1.0) -> int:
    mechanism = f'{{"kind": "epsilon_delta", "epsilon": {epsilon}}}'
    (pipeline_id,) = ledger.submit_many([PipelineRequest(name="p", dataset="d", block_keys=["b"], mechanism=mechanism, elastic_min=least)])
    return pipeline_id


def test_a_grant_of_a_fraction_allocates_exactly_that_fraction_of_the_demand_and_audits_clean(ledger):
    pipeline_id = elastic(ledger, 0.25)
    assert ledger.grant([pipeline_id], fractions={pipeline_id: 0.4}) == [pipeline_id]
    info = ledger.get_pipeline(pipeline_id)
    allocated = ledger.get_block("d", "b").allocated
    assert (info.fraction, info.elastic_min) == (0.4, 0.25)
    np.testing.assert_array_equal(allocated, granted_amount(info.demands["b"], 0.4))
    assert np.all(allocated < info.demands["b"])
    ledger.complete(pipeline_id, allocated)
    assert ledger.audit().ok


@pytest.mark.parametrize(("least", "fraction"), [(0.5, 0.4), (None, 0.9)], ids=["below-its-min", "a-fixed-demand"])
def test_a_fraction_a_pipeline_does_not_accept_is_refused_and_nothing_moves(ledger, least, fraction):
    pipeline_id = elastic(ledger, least)
    before = ledger.get_block("d", "b")
    with pytest.raises(LedgerError, match="accepts a fraction of its demand"):
        ledger.grant([pipeline_id], fractions={pipeline_id: fraction})
    assert ledger.get_pipeline(pipeline_id).state == "pending"
    np.testing.assert_array_equal(ledger.get_block("d", "b").unlocked, before.unlocked)


def test_a_job_granted_a_fraction_cannot_report_spending_its_whole_demand(ledger):
    pipeline_id = elastic(ledger, 0.25)
    ledger.grant([pipeline_id], fractions={pipeline_id: 0.5})
    with pytest.raises(LedgerError, match="spent more than its grant"):
        ledger.complete(pipeline_id, ledger.get_pipeline(pipeline_id).demands["b"])


def test_an_audit_names_a_granted_fraction_changed_in_the_file(ledger):
    pipeline_id = elastic(ledger, 0.25)
    ledger.grant([pipeline_id], fractions={pipeline_id: 0.5})
    with sqlite3.connect(ledger.path, isolation_level=None) as conn:
        conn.execute("UPDATE pipelines SET fraction = 0.75 WHERE id = ?", [pipeline_id])
    assert any(f"pipeline {pipeline_id} on block d/b: holds" in v for v in ledger.audit().violations)


@settings(max_examples=20)
@given(
    st.lists(
        st.tuples(st.floats(0.05, 0.9), st.one_of(st.none(), st.floats(0.05, 1.0)), st.floats(0.0, 1.0), st.booleans()),
        min_size=1,
        max_size=8,
    )
)
def test_interleaved_fixed_and_elastic_grants_stay_within_their_ranges_and_the_blocks_capacity(tmp_path_factory, pipelines):
    """Each pipeline: its ε, its least fraction (None: fixed), where in [least, 1] the grant
    falls, whether its job then completes spending all of its grant."""
    with Ledger(tmp_path_factory.mktemp("l") / "l.db", create=True) as ledger:
        ledger.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
        ledger.add_blocks("d", ["b"], unlocked_fraction=1.0)
        for epsilon, least, where, completes in pipelines:
            pipeline_id = elastic(ledger, least, round(epsilon, 3))
            fraction = 1.0 if least is None else least + where * (1.0 - least)
            before = ledger.get_block("d", "b").unlocked
            granted = ledger.grant([pipeline_id], fractions={pipeline_id: fraction}) == [pipeline_id]
            info = ledger.get_pipeline(pipeline_id)
            share = granted_amount(info.demands["b"], fraction)
            assert granted == bool(np.all(share <= before))  # granted exactly when its share fits
            if granted:
                assert (info.fraction or 1.0) == fraction and (info.elastic_min or 1.0) <= fraction
                after = ledger.get_block("d", "b").unlocked  # exactly the share moved, in quanta
                np.testing.assert_array_equal(units(before, up=False) - units(after, up=False), units(share, up=True))
                if completes:
                    ledger.complete(pipeline_id, share)
        block = ledger.get_block("d", "b")
        assert np.all(block.allocated + block.consumed <= block.capacity)
        assert ledger.audit().ok
