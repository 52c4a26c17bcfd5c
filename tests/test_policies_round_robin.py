"""Round robin's water-filling (docs/design.md §4.2): even split, capped at the need, conserved."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.policies import Snapshot, make_policy
from privsched.policies.round_robin import fill_requirement, water_fill
from tests.support.snapshots import make_snapshot, snapshots


def _pass(snapshot: Snapshot, reserved: np.ndarray | None = None):
    with_reserved = Snapshot(**{**snapshot.__dict__, "reserved": reserved})
    return make_policy("rr-n", n=1).policy.allocate(with_reserved)


def test_budget_is_split_evenly_among_waiting_pipelines() -> None:
    snapshot = make_snapshot([{0: 2.0}, {0: 2.0}, {0: 2.0}], unlocked=[3.0])
    allocation = _pass(snapshot)
    assert allocation.reserved[:, 0].tolist() == [1.0, 1.0, 1.0]
    assert allocation.granted.tolist() == []


def test_a_small_need_is_filled_and_its_surplus_goes_to_the_others() -> None:
    snapshot = make_snapshot([{0: 0.5}, {0: 4.0}, {0: 4.0}], unlocked=[3.0])
    allocation = _pass(snapshot)
    assert allocation.reserved[:, 0].tolist() == [0.5, 1.25, 1.25]
    assert allocation.granted.tolist() == [0]


def test_a_pipeline_is_granted_once_every_block_has_filled_its_demand() -> None:
    snapshot = make_snapshot([{0: 1.0, 1: 1.0}], unlocked=[2.0, 0.5])
    first = _pass(snapshot)
    assert first.granted.tolist() == []
    assert first.reserved[:, 0].tolist() == [1.0, 0.5]
    # The caller took the reservations out of unlocked; half a unit more arrives on block 1.
    second = _pass(make_snapshot([{0: 1.0, 1: 1.0}], unlocked=[1.0, 0.5]), reserved=first.reserved)
    assert second.granted.tolist() == [0]
    assert second.reserved[:, 0].tolist() == [1.0, 1.0]


def test_granted_pipelines_are_listed_in_arrival_order() -> None:
    snapshot = make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[2.0], arrival=[5.0, 1.0])
    assert _pass(snapshot).granted.tolist() == [1, 0]


@settings(max_examples=100, deadline=None)
@given(snapshot=snapshots(rdp=False), data=st.data())
def test_water_filling_conserves_budget_and_never_exceeds_a_need(snapshot: Snapshot, data) -> None:
    reserved = (
        snapshot.edge_demand
        * np.array(
            data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=len(snapshot.edge_demand), max_size=len(snapshot.edge_demand)))
        )[:, None]
    )
    allocation = _pass(snapshot, reserved)
    added = allocation.reserved - reserved
    need = snapshot.edge_demand - reserved
    assert np.all(added >= -1e-12) and np.all(added <= need + 1e-12)
    for b in range(snapshot.n_blocks):
        on_block = snapshot.edge_block == b
        expected = np.minimum(snapshot.unlocked[b], need[on_block].sum(axis=0))
        assert np.allclose(added[on_block].sum(axis=0), expected)
    full = np.all(np.isclose(allocation.reserved, snapshot.edge_demand), axis=1)
    waiting = {int(p) for p in snapshot.edge_pipeline[~full]}
    assert set(allocation.granted.tolist()) == set(range(snapshot.n_pipelines)) - waiting


def test_water_fill_levels_are_equal_for_every_unfilled_edge() -> None:
    give = water_fill(np.array([0, 0, 0, 1, 1]), np.array([1.0, 3.0, 5.0, 2.0, 2.0]), np.array([6.0, 1.0]))
    assert give.tolist() == [1.0, 2.5, 2.5, 0.5, 0.5]


def test_round_robin_rejects_rdp_accounting() -> None:
    snapshot = make_snapshot([{0: [0.5, 0.5]}], unlocked=[[1.0, 1.0]], accounting=Accounting.rdp((2.0, 4.0)))
    with pytest.raises(ValueError, match="basic accounting only"):
        _pass(snapshot)


def test_fill_requirement_counts_each_other_need_up_to_the_edges_own() -> None:
    blocks, need = np.array([0, 0, 0, 1]), np.array([0.5, 4.0, 2.0, 1.0])
    assert fill_requirement(blocks, need).tolist() == [1.5, 6.5, 4.5, 1.0]  # e.g. 0.5 + 2 + 2 for the 2
    assert fill_requirement(np.array([0, 0]), np.array([0.0, 1.0])).tolist() == [0.0, 1.0]  # no need: no requirement


@settings(max_examples=200, deadline=None)
@given(
    edges=st.lists(st.tuples(st.integers(0, 2), st.floats(0.01, 1.0)), min_size=1, max_size=8),
    budget=st.floats(0.0, 4.0),
)
def test_water_fill_fills_an_edge_exactly_when_its_block_holds_its_fill_requirement(edges, budget) -> None:
    blocks = np.array([b for b, _ in edges])
    need = np.array([r for _, r in edges])
    required = fill_requirement(blocks, need)
    given_ = water_fill(blocks, need, np.full(3, budget))
    filled = given_ == need
    margin = 1e-9 * max(budget, 1.0)
    assert filled[required <= budget - margin].all()
    assert not filled[required > budget + margin].any()
