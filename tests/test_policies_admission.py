"""The shared best-effort admission pass (docs/design.md §4.2) against a naive reference walk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.policies import admission, admit_in_order
from privsched.policies.base import Snapshot


def naive_admit(snapshot: Snapshot, order: np.ndarray) -> np.ndarray:
    """Reference: one pipeline at a time, test every block, subtract, move on."""
    accounting = snapshot.accounting
    available = np.array(snapshot.unlocked, dtype=float)
    live = accounting.live(snapshot.capacity)
    count = np.bincount(snapshot.edge_pipeline, minlength=snapshot.n_pipelines)
    start = np.cumsum(count) - count
    granted = []
    for p in order:
        edges = range(start[p], start[p] + count[p])
        blocks = [snapshot.edge_block[e] for e in edges]
        if all(accounting.fits(snapshot.edge_demand[e], available[b], live[b]) for e, b in zip(edges, blocks)):
            for e, b in zip(edges, blocks):
                available[b] = available[b] - snapshot.edge_demand[e]
            granted.append(p)
    return np.array(granted, dtype=np.intp)


def make_snapshot(
    demands: list[dict[int, float | list[float]]],
    unlocked: list,
    capacity: list | None = None,
    accounting: Accounting | None = None,
    arrival: list[float] | None = None,
    ids: list[str] | None = None,
    weight: list[float] | None = None,
) -> Snapshot:
    """A snapshot from plain lists: ``demands[i]`` maps block → demand (an ε under basic
    accounting, with δ = 0; a vector over the orders under RDP)."""
    accounting = accounting or Accounting.basic()

    def vector(value) -> list[float]:
        return [float(value), 0.0] if np.isscalar(value) and not accounting.is_rdp else list(value)

    unlocked_array = np.array([vector(u) for u in unlocked], dtype=float)
    rows = [(i, b, vector(d)) for i, wants in enumerate(demands) for b, d in sorted(wants.items())]
    n = len(demands)
    dims = accounting.dims
    return Snapshot(
        accounting=accounting,
        capacity=np.array([vector(c) for c in capacity], dtype=float) if capacity else unlocked_array.copy(),
        unlocked=unlocked_array,
        pipeline_ids=np.array(ids or [f"p{i}" for i in range(n)]),
        arrival=np.array(arrival if arrival is not None else range(n), dtype=float),
        weight=np.array(weight if weight is not None else [1.0] * n, dtype=float),
        edge_pipeline=np.array([r[0] for r in rows], dtype=np.intp),
        edge_block=np.array([r[1] for r in rows], dtype=np.intp),
        edge_demand=np.array([r[2] for r in rows], dtype=float).reshape(len(rows), dims),
    )


def spends_within(snapshot: Snapshot, granted: np.ndarray) -> bool:
    """Whether granting ``granted`` in order keeps every block within its unlocked budget:
    after each grant, every block's total holds in every dimension (basic) or at some live
    order (RDP), which is what sequential fitting guarantees."""
    live = snapshot.accounting.live(snapshot.capacity)
    total = np.zeros_like(snapshot.unlocked)
    for p in granted:
        edges = np.flatnonzero(snapshot.edge_pipeline == p)
        np.add.at(total, snapshot.edge_block[edges], snapshot.edge_demand[edges])
        touched = np.unique(snapshot.edge_block[edges])
        if not np.all(snapshot.accounting.fits(total[touched], snapshot.unlocked[touched], live[touched])):
            return False
    return True


# Demands and budgets are multiples of 1/4 so that every sum is exact in floating point.
quarters = st.integers(min_value=0, max_value=8).map(lambda q: q / 4)


@st.composite
def snapshots(draw, rdp: bool | None = None) -> Snapshot:
    """Random small snapshots, basic or RDP (3 orders, some dead on some blocks)."""
    if rdp is None:
        rdp = draw(st.booleans())
    accounting = Accounting.rdp((2.0, 4.0, 8.0)) if rdp else Accounting.basic()
    dims = accounting.dims
    n_blocks = draw(st.integers(1, 4))
    n_pipelines = draw(st.integers(0, 12))
    capacity = [[draw(quarters) for _ in range(dims)] for _ in range(n_blocks)]
    unlocked = [[draw(st.integers(0, 4)) / 4 * c for c in row] for row in capacity]
    demands = []
    for _ in range(n_pipelines):
        blocks = draw(st.sets(st.integers(0, n_blocks - 1), min_size=0, max_size=n_blocks))
        demands.append({b: [draw(quarters) for _ in range(dims)] for b in blocks})
    arrival = [draw(st.integers(0, 3)) for _ in range(n_pipelines)]
    return make_snapshot(demands, unlocked, capacity, accounting, arrival=arrival)


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
    snapshot = make_snapshot(
        [{0: [3.0, 0.5]}, {0: [0.1, 0.6]}, {0: [0.1, 0.5]}], unlocked=[[1.0, 1.0]], accounting=rdp
    )
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
        {int(b): (rng.integers(0, 6, dims) / 4).tolist() for b in rng.choice(6, rng.integers(1, 4), replace=False)}
        for _ in range(150)
    ]
    snapshot = make_snapshot(demands, unlocked=(rng.integers(4, 40, (6, dims)) / 4).tolist(), accounting=accounting)
    order = rng.permutation(150)
    granted = admit_in_order(snapshot, order)
    assert 10 < len(granted) < 140
    assert np.array_equal(granted, naive_admit(snapshot, order))
