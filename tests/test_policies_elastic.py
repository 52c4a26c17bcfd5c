"""Elastic demands in the policies (docs/design.md §4.2, elastic demands)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.budgets.exact import sum_at, units
from privsched.policies.admission import EdgeTable, at_minimum, charge, dominant_shares, edge_shares, validate, validate_allocation
from privsched.policies.base import Allocation, Quotas, Snapshot
from privsched.policies.dpack import DPack
from privsched.policies.dpf import DominantPrivateBlockFairness, dpf_order
from privsched.policies.fcfs import FirstComeFirstServed
from privsched.policies.optimal import Optimal
from privsched.policies.round_robin import RoundRobin
from tests.support.snapshots import make_snapshot, quarters, snapshots


def _elastic(snapshot: Snapshot, low: list[float]) -> Snapshot:
    return Snapshot(**{**snapshot.__dict__, "elastic_min": np.array(low, dtype=float)})


@pytest.mark.parametrize("low", [[0.5], [0.0, 1.0], [1.5, 1.0], [np.nan, 1.0]])
def test_a_snapshot_with_a_malformed_elastic_minimum_is_rejected_with_one_line(low) -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[2.0]), low)
    with pytest.raises(ValueError, match="elastic_min") as error:
        validate(snapshot)
    assert "\n" not in str(error.value)


def test_an_allocation_outside_a_pipelines_range_is_rejected() -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[2.0]), [0.5, 1.0])
    validate_allocation(snapshot, Allocation(granted=np.array([0, 1]), fraction=np.array([0.5, 1.0])))
    for fraction in ([0.4, 1.0], [0.5, 0.9], [1.1, 1.0], [1.0]):
        with pytest.raises(ValueError) as error:
            validate_allocation(snapshot, Allocation(granted=np.array([0, 1]), fraction=np.array(fraction)))
        assert "\n" not in str(error.value)


def test_an_allocation_without_fractions_grants_every_pipeline_its_whole_demand() -> None:
    assert Allocation(granted=np.array([2, 0])).fractions().tolist() == [1.0, 1.0]


fractions = st.one_of(st.just(1.0), st.sampled_from([0.25, 0.5, 0.75]), st.floats(min_value=0.01, max_value=1.0))


@st.composite
def elastic_snapshots(draw, rdp: bool | None = None, quotas: bool = True) -> Snapshot:
    """Random snapshots whose pipelines are a random mix of fixed and elastic demands, under
    random team quotas or none."""
    snapshot = draw(snapshots(rdp=rdp))
    n, n_blocks, dims = snapshot.n_pipelines, snapshot.n_blocks, snapshot.accounting.dims
    low = np.array([draw(fractions) for _ in range(n)], dtype=float)
    under = None
    if quotas and draw(st.booleans()):
        teams = draw(st.integers(1, 2))
        under = Quotas(
            team=np.array([draw(st.integers(-1, teams - 1)) for _ in range(n)], dtype=np.intp),
            share=np.array([draw(st.integers(0, 4)) / 4 for _ in range(teams)]),
            held=np.array([[[draw(quarters) / 4 for _ in range(dims)] for _ in range(n_blocks)] for _ in range(teams)]),
        )
    return replace(snapshot, elastic_min=low, quotas=under)


def charged(snapshot: Snapshot, allocation: Allocation) -> np.ndarray:
    """(E, K) quanta: what the allocation charges each edge (0 for a pipeline not granted)."""
    per_pipeline = np.zeros(snapshot.n_pipelines)
    per_pipeline[np.asarray(allocation.granted, dtype=np.intp)] = allocation.fractions()
    return charge(snapshot.edge_demand, per_pipeline[snapshot.edge_pipeline][:, None]) * (per_pipeline[snapshot.edge_pipeline] > 0)[:, None]


def within_budget(snapshot: Snapshot, allocation: Allocation) -> bool:
    """Whether every block's total charge fits its unlocked budget, and every team's fits
    its quota's room, in exact quanta (under RDP at some live order)."""
    accounting, live = snapshot.accounting, snapshot.accounting.live(snapshot.capacity)
    rows = charged(snapshot, allocation)
    total = sum_at(snapshot.n_blocks, snapshot.edge_block, rows)
    touched = np.unique(snapshot.edge_block[np.isin(snapshot.edge_pipeline, allocation.granted)])
    if not np.all(accounting.fits_units(total[touched], units(snapshot.unlocked, up=False)[touched], live[touched])):
        return False
    quotas = snapshot.quotas
    if quotas is None:
        return True
    room = quotas.room(snapshot.capacity)
    for team in range(len(quotas.share)):
        mine = (quotas.team[snapshot.edge_pipeline] == team) & np.isin(snapshot.edge_pipeline, allocation.granted)
        held = sum_at(snapshot.n_blocks, snapshot.edge_block[mine], rows[mine])
        touched = np.unique(snapshot.edge_block[mine])
        if not np.all(accounting.fits_units(held[touched], room[team][touched], live[touched])):
            return False
    return True


POLICIES = {
    "fcfs": FirstComeFirstServed(),
    "dpf": DominantPrivateBlockFairness(),
    "dpack": DPack(),
    "dpf-n": DominantPrivateBlockFairness(fair_share=0.25),
    "dpack-n": DPack(fair_share=0.25),
    "dpack-k2": DPack(k=2),  # refreshes often: recounts reach the quotas' twin edges
}


@settings(max_examples=150, deadline=None)
@given(snapshot=elastic_snapshots(), name=st.sampled_from(sorted(POLICIES)))
def test_every_elastic_grant_is_within_its_range_and_no_block_exceeds_its_budget(snapshot: Snapshot, name: str) -> None:
    allocation = POLICIES[name].allocate(snapshot)
    validate_allocation(snapshot, allocation)
    assert within_budget(snapshot, allocation)


@settings(max_examples=100, deadline=None)
@given(snapshot=elastic_snapshots(), name=st.sampled_from(sorted(POLICIES)))
def test_with_every_pipeline_fixed_the_allocation_is_the_fixed_demand_one(snapshot: Snapshot, name: str) -> None:
    fixed = replace(snapshot, elastic_min=np.ones(snapshot.n_pipelines))
    allocation, today = POLICIES[name].allocate(fixed), POLICIES[name].allocate(replace(snapshot, elastic_min=None))
    assert np.array_equal(allocation.granted, today.granted)
    assert np.all(allocation.fractions() == 1.0)


@settings(max_examples=100, deadline=None)
@given(snapshot=elastic_snapshots(), name=st.sampled_from(sorted(POLICIES)))
def test_who_is_granted_is_what_the_fixed_policy_grants_at_the_minimums(snapshot: Snapshot, name: str) -> None:
    at_minimums = POLICIES[name].allocate(at_minimum(snapshot))
    assert np.array_equal(POLICIES[name].allocate(snapshot).granted, at_minimums.granted)


@settings(max_examples=100, deadline=None)
@given(snapshot=elastic_snapshots(), data=st.data())
def test_asking_for_a_range_never_costs_a_pipeline_its_place_in_dpf_order(snapshot: Snapshot, data) -> None:
    if snapshot.n_pipelines == 0:
        return
    assert snapshot.elastic_min is not None
    i = data.draw(st.integers(0, snapshot.n_pipelines - 1))
    fixed = snapshot.elastic_min.copy()
    fixed[i] = 1.0
    place = int(np.flatnonzero(dpf_order(snapshot) == i)[0])
    place_fixed = int(np.flatnonzero(dpf_order(replace(snapshot, elastic_min=fixed)) == i)[0])
    assert place <= place_fixed


@settings(max_examples=100, deadline=None)
@given(snapshot=elastic_snapshots(quotas=False), data=st.data())
def test_no_granted_pipeline_could_take_more_once_the_others_are_charged(snapshot: Snapshot, data) -> None:
    allocation = POLICIES[data.draw(st.sampled_from(["dpack", "dpf", "fcfs"]))].allocate(snapshot)  # no fair share
    rows = charged(snapshot, allocation)
    for position, i in enumerate(np.asarray(allocation.granted).tolist()):
        f = float(allocation.fractions()[position])
        if f == 1.0:
            continue
        mine = snapshot.edge_pipeline == i
        others = sum_at(snapshot.n_blocks, snapshot.edge_block[~mine], rows[~mine])
        room = units(snapshot.unlocked, up=False) - others
        more = charge(snapshot.edge_demand[mine], min(1.0, f * (1 + 1e-6) + 1e-9))
        live = snapshot.accounting.live(snapshot.capacity)[snapshot.edge_block[mine]]
        assert not np.all(snapshot.accounting.fits_units(more, room[snapshot.edge_block[mine]], live))


@pytest.mark.parametrize("policy", ["dpack", "dpf", "fcfs"])
def test_a_lone_elastic_pipeline_takes_the_largest_fraction_that_fits(policy: str) -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0, 1: 2.0}], unlocked=[0.9, 1.4]), [0.5])
    allocation = POLICIES[policy].allocate(snapshot)
    assert allocation.granted.tolist() == [0]
    assert allocation.fractions()[0] == pytest.approx(0.7, abs=1e-12)


def test_a_pipeline_whose_minimum_does_not_fit_is_not_granted() -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0}], unlocked=[0.4]), [0.5])
    assert DominantPrivateBlockFairness().allocate(snapshot).granted.tolist() == []


def test_every_minimum_is_served_before_any_top_up() -> None:
    # Fixed DPF at the minimums grants both (0.5 + 0.5 ≤ 1): the first is topped up only to what the second leaves.
    snapshot = _elastic(make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[1.2]), [0.5, 0.5])
    allocation = DominantPrivateBlockFairness().allocate(snapshot)
    assert sorted(allocation.granted.tolist()) == [0, 1]
    assert sorted(allocation.fractions().tolist()) == pytest.approx([0.5, 0.7])


def test_rdp_top_up_fits_at_some_live_order() -> None:
    rdp = Accounting.rdp((2.0, 4.0))
    # Order 2 holds 0.5 of the demand, order 4 holds 0.8: the grant takes 0.8, fitting at order 4.
    snapshot = _elastic(make_snapshot([{0: [1.0, 1.0]}], unlocked=[[0.5, 0.8]], accounting=rdp), [0.25])
    assert DominantPrivateBlockFairness().allocate(snapshot).fractions()[0] == pytest.approx(0.8, abs=1e-12)


def test_round_robin_refuses_elastic_demands() -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0}], unlocked=[1.0]), [0.5])
    with pytest.raises(ValueError, match="fixed demands only"):
        RoundRobin().allocate(snapshot)


@settings(max_examples=100, deadline=None)
@given(snapshot=elastic_snapshots(), fair_share=st.sampled_from([0.1, 0.25, 0.5]), name=st.sampled_from(["dpf", "dpack", "fcfs"]))
def test_no_top_up_goes_past_the_fair_share(snapshot: Snapshot, fair_share: float, name: str) -> None:
    policy = replace(POLICIES[name], fair_share=fair_share)  # type: ignore[type-var]
    allocation = policy.allocate(snapshot)
    table = EdgeTable.of(snapshot)
    dominant = dominant_shares(table, edge_shares(snapshot, table))[allocation.granted]
    assert snapshot.elastic_min is not None
    low = snapshot.elastic_min[allocation.granted]
    above = allocation.fractions() > low
    assert np.all(allocation.fractions()[above] * dominant[above] <= fair_share * (1 + 1e-9))


def test_a_fair_share_tops_up_to_one_nth_of_the_block() -> None:
    snapshot = _elastic(make_snapshot([{0: 1.0}], unlocked=[1.0], capacity=[4.0]), [0.1])
    assert DominantPrivateBlockFairness(fair_share=0.125).allocate(snapshot).fractions()[0] == pytest.approx(0.5)


def test_the_optimal_solver_chooses_on_the_minimums_and_tops_up() -> None:
    # At full demand only one of the two fits; at their minimums both do, and the first is topped up.
    snapshot = _elastic(make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[1.5]), [0.5, 0.5])
    allocation = Optimal(time_limit=10.0).allocate(snapshot)
    validate_allocation(snapshot, allocation)
    assert sorted(allocation.granted.tolist()) == [0, 1]
    assert within_budget(snapshot, allocation) and allocation.fractions().sum() == pytest.approx(1.5)
