"""The policy snapshot of a pending view (privsched.service.snapshot): edges point at the
view's blocks by index, and round robin's reservations leave their blocks' unlocked budget."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.ledger.models import PendingBatch, PendingView
from privsched.service.snapshot import snapshot_of

BASIC = Accounting.basic()


@st.composite
def views(draw: st.DrawFn) -> tuple[PendingView, np.ndarray]:
    """A view over some blocks (ascending, gapped ids) with pipelines asking for some of
    them, and a reservation per edge."""
    block_ids = np.array(sorted(draw(st.sets(st.integers(1, 1000), min_size=1, max_size=6))), dtype=np.int64)
    asks = draw(st.lists(st.lists(st.sampled_from(block_ids.tolist()), min_size=1, max_size=3, unique=True), max_size=5))
    edges = [(p, b) for p, blocks in enumerate(asks) for b in blocks]
    budget = st.floats(0.0, 1.0, allow_nan=False)
    unlocked = np.array(draw(st.lists(st.tuples(budget, budget), min_size=len(block_ids), max_size=len(block_ids))), dtype=float).reshape(
        -1, 2
    )
    reserved = np.array(draw(st.lists(st.tuples(budget, budget), min_size=len(edges), max_size=len(edges))), dtype=float).reshape(-1, 2)
    none = np.zeros(0, dtype=np.int64)
    pipelines = PendingBatch(
        pipeline_ids=np.arange(10, 10 + len(asks), dtype=np.int64),
        arrival=np.arange(len(asks), dtype=float),
        weight=np.ones(len(asks)),
        deadline=np.full(len(asks), np.inf),
        edge_pipeline=np.array([p for p, _ in edges], dtype=np.int64) if edges else none,
        edge_block=np.array([b for _, b in edges], dtype=np.int64) if edges else none,
        edge_demand=np.full((len(edges), 2), 0.1),
    )
    view = PendingView(accounting=BASIC, block_ids=block_ids, capacity=np.ones((len(block_ids), 2)), unlocked=unlocked, pipelines=pipelines)
    return view, reserved


@settings(max_examples=100, deadline=None)
@given(views())
def test_snapshot_edges_index_the_blocks_each_edge_names(case: tuple[PendingView, np.ndarray]) -> None:
    view, _ = case
    snapshot = snapshot_of(view, clock=7.0)
    assert view.block_ids[snapshot.edge_block].tolist() == view.pipelines.edge_block.tolist()
    assert snapshot.pipeline_ids is view.pipelines.pipeline_ids and snapshot.edge_demand is view.pipelines.edge_demand
    assert snapshot.clock == 7.0 and snapshot.reserved is None
    assert np.array_equal(snapshot.unlocked, view.unlocked)


@settings(max_examples=100, deadline=None)
@given(views())
def test_reservations_leave_the_unlocked_budget_of_their_blocks(case: tuple[PendingView, np.ndarray]) -> None:
    view, reserved = case
    snapshot = snapshot_of(view, reserved=reserved)
    for row, block_id in enumerate(view.block_ids.tolist()):
        held = reserved[view.pipelines.edge_block == block_id].sum(axis=0)
        np.testing.assert_allclose(snapshot.unlocked[row], view.unlocked[row] - held)
    assert snapshot.reserved is reserved
