"""The shared best-effort admission pass (docs/design.md §4.2) against a naive reference walk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.policies import admission, admit_in_order
from privsched.policies.base import Snapshot
from tests.support.snapshots import make_snapshot, naive_admit, snapshots, spends_within


@settings(max_examples=150, deadline=None)
@given(snapshot=snapshots(), data=st.data())
def test_vectorised_admission_equals_the_naive_walk(snapshot: Snapshot, data) -> None:
    order = np.array(data.draw(st.permutations(range(snapshot.n_pipelines))), dtype=np.intp)
    assert np.array_equal(admit_in_order(snapshot, order), naive_admit(snapshot, order))


@settings(max_examples=100, deadline=None)
@given(snapshot=snapshots(), data=st.data())
def test_admission_never_overspends(snapshot: Snapshot, data) -> None:
    order = np.array(data.draw(st.permutations(range(snapshot.n_pipelines))), dtype=np.intp)
    assert spends_within(snapshot, admit_in_order(snapshot, order))


def test_admission_walks_a_subset_of_the_pipelines_in_the_given_order() -> None:
    snapshot = make_snapshot([{0: 1.0}, {0: 1.0}, {0: 1.0}], unlocked=[2.0])
    assert admit_in_order(snapshot, np.array([2, 0])).tolist() == [2, 0]


def test_admission_skips_a_pipeline_that_does_not_fit_and_keeps_going() -> None:
    snapshot = make_snapshot([{0: 0.5}, {0: 2.0}, {0: 0.5}, {1: 1.0}], unlocked=[1.0, 0.5])
    assert admit_in_order(snapshot, np.arange(4)).tolist() == [0, 2]


def test_admission_is_all_or_nothing_across_blocks() -> None:
    snapshot = make_snapshot([{0: 1.0, 1: 1.0}, {0: 1.0}], unlocked=[1.0, 0.5])
    assert admit_in_order(snapshot, np.arange(2)).tolist() == [1]


def test_rdp_demand_fits_at_some_live_order_and_is_charged_at_every_order() -> None:
    rdp = Accounting.rdp((2.0, 4.0))
    # Fits at α = 4 only; once charged, α = 2 is overdrawn and α = 4 has 0.5 left.
    snapshot = make_snapshot([{0: [3.0, 0.5]}, {0: [0.1, 0.6]}, {0: [0.1, 0.5]}], unlocked=[[1.0, 1.0]], accounting=rdp)
    assert admit_in_order(snapshot, np.arange(3)).tolist() == [0, 2]


def test_a_dead_order_never_admits_anything() -> None:
    rdp = Accounting.rdp((2.0, 4.0))
    snapshot = make_snapshot([{0: [0.0, 2.0]}], unlocked=[[0.0, 1.0]], capacity=[[0.0, 1.0]], accounting=rdp)
    assert admit_in_order(snapshot, np.arange(1)).tolist() == []


def test_admission_rejects_edges_not_grouped_by_pipeline() -> None:
    snapshot = make_snapshot([{0: 1.0}, {0: 1.0}], unlocked=[2.0])
    shuffled = Snapshot(**{**snapshot.__dict__, "edge_pipeline": np.array([1, 0])})
    with pytest.raises(ValueError, match="grouped by pipeline"):
        admit_in_order(shuffled, np.arange(2))


def test_malformed_snapshots_are_rejected_with_one_line() -> None:
    snapshot = make_snapshot([{0: 1.0}, {1: 1.0}], unlocked=[2.0, 2.0])
    broken = {
        "edge_demand": np.array([[1.0, 0.0], [-1.0, 0.0]]),
        "edge_block": np.array([0, 5]),
        "unlocked": np.array([[1.0, 0.0]]),
        "weight": np.ones(3),
    }
    for field, value in broken.items():
        with pytest.raises(ValueError) as error:
            admit_in_order(Snapshot(**{**snapshot.__dict__, field: value}), np.arange(2))
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("accounting", [Accounting.basic(), Accounting.rdp((2.0, 4.0, 8.0))], ids=["basic", "rdp"])
def test_admission_worked_through_in_small_slices_equals_the_naive_walk(monkeypatch, accounting) -> None:
    monkeypatch.setattr(admission, "SLICE_ROWS", 5)
    rng = np.random.default_rng(7)
    dims = accounting.dims
    demands = [
        {int(b): (rng.integers(0, 6, dims) / 4).tolist() for b in rng.choice(6, rng.integers(1, 4), replace=False)} for _ in range(150)
    ]
    snapshot = make_snapshot(demands, unlocked=(rng.integers(4, 40, (6, dims)) / 4).tolist(), accounting=accounting)
    order = rng.permutation(150)
    granted = admit_in_order(snapshot, order)
    assert 10 < len(granted) < 140
    assert np.array_equal(granted, naive_admit(snapshot, order))
