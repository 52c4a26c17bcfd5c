"""Elastic demands in the simulator and the macrobenchmark (docs/design.md §4.2, elastic
demands): ranges [m·ε, ε], the shortcuts' equivalence with a full pass, budgets never
exceeded, and ``--elastic`` on the command line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from privsched.budgets.exact import share_of
from privsched.cli import app
from privsched.simulation import SimulationResult, resolve_policy, run
from privsched.simulation.api import load_workload, simulate
from privsched.simulation.engine import Simulator
from privsched.simulation.generated import covering_fraction
from tests.support.traces import random_trace

SMALL = {"days": 8, "pipelines_per_day": 40.0}
POLICIES = [("fcfs", {}), ("dpf-n", {"n": 40}), ("dpf-t", {"lifetime": 4 * 86_400.0}), ("dpack-n", {"n": 40, "k": 5})]


def outcome(result) -> list[tuple[str, float | None, float | None]]:
    fraction = result.fraction if result.fraction is not None else np.ones(len(result.status))
    return [
        (s, None if np.isnan(t) else float(t), None if np.isnan(f) else float(f))
        for s, t, f in zip(result.status, result.grant_time, fraction)
    ]


@pytest.mark.parametrize("policy,params", POLICIES, ids=[p for p, _ in POLICIES])
def test_elastic_shortcuts_grant_exactly_what_a_full_pass_at_every_instant_grants(policy, params) -> None:
    _, instance = load_workload("macro-rdp", seed=2, elastic=0.5, **SMALL)
    spec = resolve_policy(policy, **params)
    fast, reference = run("macro-rdp", instance, spec), run("macro-rdp", instance, spec, shortcuts=False)
    assert fast.granted > 0 and np.nanmin(fast.fraction) < 1
    assert outcome(fast) == outcome(reference)
    np.testing.assert_allclose(fast.block_used, reference.block_used, atol=1e-12)


@pytest.mark.parametrize("policy,params", POLICIES, ids=[p for p, _ in POLICIES])
def test_elastic_grants_stay_within_their_ranges_and_every_block_within_capacity(policy, params) -> None:
    _, instance = load_workload("macro-rdp", seed=3, elastic=0.5, **SMALL)
    simulator = Simulator(instance, resolve_policy(policy, **params), samples=0)
    state = simulator.run()
    granted = state.status == 2
    assert granted.any()
    assert np.all(state.fraction[granted] >= instance.elastic_min[granted]) and np.all(state.fraction[granted] <= 1)
    assert np.all(np.isnan(state.fraction[~granted]))
    acc = instance.accounting
    assert np.all(acc.fits_units(simulator.consumed, simulator.cap_units, simulator.live))


def test_a_range_of_one_is_a_fixed_demand() -> None:
    fixed = simulate("macro-rdp", "dpf-n", n=40, seed=4, **SMALL)
    ranged = simulate("macro-rdp", "dpf-n", n=40, seed=4, elastic=1.0, **SMALL)
    assert outcome(ranged) == outcome(fixed)


def test_elastic_demands_serve_more_pipelines_than_fixed_ones_on_the_same_trace() -> None:
    fixed = simulate("macro-rdp", "dpf-n", n=40, seed=5, **SMALL)
    ranged = simulate("macro-rdp", "dpf-n", n=40, seed=5, elastic=0.5, **SMALL)
    assert ranged.granted > fixed.granted


def test_a_mouse_accepts_half_its_laplace_charge_and_an_elephant_what_its_recalibrated_plan_needs() -> None:
    _, instance = load_workload("macro", seed=1, elastic=0.5, days=4, pipelines_per_day=40.0)
    mice = instance.klass == "mice"
    assert np.all(instance.elastic_min[mice] == pytest.approx(0.5))
    _, rdp = load_workload("macro-rdp", seed=1, elastic=0.5, days=4, pipelines_per_day=40.0)
    assert np.all((rdp.elastic_min > 0) & (rdp.elastic_min < 1))  # a plan that reaches no m·ε takes the least ε it reaches
    assert np.any(rdp.elastic_min[rdp.klass == "elephants"] < 0.5)


curves = st.lists(st.floats(min_value=1e-9, max_value=1e3), min_size=3, max_size=3).map(np.array)


@settings(max_examples=200, deadline=None)
@given(maximum=curves, minimum=curves)
def test_the_covering_fraction_of_a_maximum_covers_the_minimum_at_every_order(maximum, minimum) -> None:
    f = covering_fraction(maximum, minimum, np.ones(3, dtype=bool))
    assert 0 < f <= 1
    if f < 1:
        assert np.all(f * maximum >= minimum)


def test_round_robin_refuses_an_elastic_workload_with_one_line() -> None:
    with pytest.raises(ValueError, match="fixed demands only"):
        simulate("macro", "rr-n", n=40, elastic=0.5, days=3, pipelines_per_day=20.0)


runner = CliRunner()


def test_simulate_elastic_reports_the_mean_granted_fraction(tmp_path) -> None:
    out = tmp_path / "out"
    args = ["simulate", "macro-rdp", "--policy", "dpf-n", "--n", "40", "--elastic", "0.5", "--out", str(out)]
    result = runner.invoke(app, args + ["-p", "days=4", "-p", "pipelines_per_day=30"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert 0.5 <= summary["mean_fraction"] <= 1
    saved = SimulationResult.from_json((out / "result.json").read_text())
    assert saved.fraction is not None and np.nanmean(saved.fraction) == pytest.approx(summary["mean_fraction"])
    assert "of the demand" in " ".join(result.output.split())


@pytest.mark.parametrize("value", ["0", "1.5", "nan"])
def test_simulate_refuses_an_elastic_fraction_outside_its_range_and_writes_nothing(tmp_path, value) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["simulate", "macro-rdp", "--policy", "dpf-n", "--n", "40", "--elastic", value, "--out", str(out)])
    assert result.exit_code == 1
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_simulate_refuses_elastic_demands_on_a_workload_that_has_no_ranges(tmp_path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["simulate", "single-block", "--policy", "dpf-n", "--n", "40", "--elastic", "0.5", "--out", str(out)])
    assert result.exit_code == 1 and "elastic" in result.output
    assert not out.exists()


def test_an_elastic_workload_is_not_written_as_a_trace_of_fixed_demands(tmp_path) -> None:
    out = tmp_path / "trace.json"
    result = runner.invoke(app, ["trace", "macro-rdp", "-p", "elastic=0.5", "-p", "days=3", "--out", str(out)])
    assert result.exit_code == 1 and "fixed demands only" in result.output
    assert not out.exists()


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    accounting=st.sampled_from(["basic", "rdp"]),
    quotas=st.sampled_from([None, {"a": 0.3, "b": 0.6}]),
    policy=st.sampled_from(["fcfs", "dpf-n", "dpf-t", "dpack-n"]),
    data=st.data(),
)
def test_random_mixes_of_elastic_and_fixed_pipelines_stay_in_range_within_capacity_and_alike_with_or_without_shortcuts(
    seed, accounting, quotas, policy, data
) -> None:
    instance = random_trace(accounting, seed, quotas=quotas).instance
    low = np.array(
        data.draw(st.lists(st.sampled_from([1.0, 1.0, 0.25, 0.5, 0.8]), min_size=instance.n_pipelines, max_size=instance.n_pipelines))
    )
    instance = replace(instance, elastic_min=low)
    spec = resolve_policy(policy, n=4, lifetime=20.0, k=3)
    fast = Simulator(instance, spec, samples=0)
    state = fast.run()
    reference = Simulator(instance, spec, samples=0, shortcuts=False).run()
    assert state.status.tolist() == reference.status.tolist()
    np.testing.assert_array_equal(state.grant_time, reference.grant_time)
    np.testing.assert_array_equal(state.fraction, reference.fraction)
    granted = state.status == 2
    assert np.all((state.fraction[granted] >= low[granted]) & (state.fraction[granted] <= 1))
    touched = np.unique(instance.edge_block)
    assert np.all(instance.accounting.fits_units(fast.consumed[touched], fast.cap_units[touched], fast.live[touched]))
    if fast.held is not None:
        room = np.stack([share_of(float(s), instance.capacity) for s in instance.share])
        for team in range(len(instance.share)):
            assert np.all(instance.accounting.fits_units(fast.held[team][touched], room[team][touched], fast.live[touched]))
