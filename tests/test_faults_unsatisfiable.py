"""A pending pipeline that no future unlock can satisfy ends with that reason, rather than
waiting forever (basic accounting: ε exhausted while δ is not, so the block never retires)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.budgets.exact import units
from privsched import connect
from privsched.ledger.models import BlockInfo, PendingBatch, PendingView
from privsched.service.unsatisfiable import never_grantable
from tests.support.blockdata import block_files


def test_a_pipeline_that_can_no_longer_fit_fails_once_the_budget_is_consumed(tmp_db: Path):
    client = connect(tmp_db)
    client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
    client.add_blocks("reviews", block_files(tmp_db.parent, ["b0"]))

    def submit(name: str, epsilon: float) -> int:
        job = {"function": "tests.service_jobs:no_report"}
        return client.submit({"name": name, "dataset": "reviews", "blocks": ["b0"], "epsilon": epsilon, "job": job}).id

    big, hopeless, small = submit("big", 0.8), submit("hopeless", 0.5), submit("small", 0.1)
    client.run_until_idle("fcfs", tick=0.05, cpus=4, gpus=0)
    ledger = client.ledger
    assert [ledger.get_pipeline(i).state for i in (big, small)] == ["completed", "completed"]
    info = ledger.get_pipeline(hopeless)
    assert info.state == "failed"
    assert info.message == "can never be granted: its demand exceeds what block 'b0' has not consumed in ε or δ"
    block = ledger.get_block("reviews", "b0")
    assert block.consumed[0] == pytest.approx(0.9) and block.state == "active"
    assert ledger.audit().ok
    client.close()


def _view(accounting: Accounting, capacity, consumed, allocated, demand) -> tuple[PendingView, dict[int, BlockInfo]]:
    capacity, consumed, allocated = (np.asarray(v, dtype=float) for v in (capacity, consumed, allocated))
    zero = np.zeros_like(capacity)
    block = BlockInfo(7, "d", "b", None, "active", 0.0, capacity, zero, capacity - consumed - allocated, allocated, consumed)
    pipelines = PendingBatch(
        pipeline_ids=np.array([3]),
        arrival=np.zeros(1),
        weight=np.ones(1),
        deadline=np.full(1, np.inf),
        edge_pipeline=np.array([0]),
        edge_block=np.array([7]),
        edge_demand=np.asarray(demand, dtype=float)[None],
    )
    view = PendingView(
        accounting=accounting, block_ids=np.array([7]), capacity=capacity[None], unlocked=block.unlocked[None], pipelines=pipelines
    )
    return view, {7: block}


budget = st.floats(0.0, 10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(budget, budget, budget, budget), min_size=4, max_size=4))
def test_only_a_demand_above_the_unconsumed_remainder_at_every_live_order_is_hopeless(orders):
    """RDP: hopeless iff no live order has demand ≤ capacity − consumed; in particular a
    demand that fits what is unlocked, locked or allocated now is never hopeless."""
    accounting = Accounting.rdp([2.0, 4.0, 8.0, 16.0])
    capacity = np.array([c for c, _, _, _ in orders])
    consumed = np.minimum([u for _, u, _, _ in orders], capacity)
    allocated = np.minimum([a for _, _, a, _ in orders], capacity - consumed)
    demand = np.array([d for _, _, _, d in orders])
    view, blocks = _view(accounting, capacity, consumed, allocated, demand)
    hopeless = 3 in never_grantable(view, blocks)
    # in the ledger's exact quanta (docs/design.md §3.3): a demand rounds up, a remainder down
    need, room = units(demand, up=True), units(capacity - consumed, up=False)
    could_fit = np.any((need <= room) & (capacity > 0))
    # within the remainder's rounding, or the relative 1e-9 it is widened by (1,000 quanta per unit)
    borderline = np.any((np.abs(need - room) <= 2 + 1.01e3 * np.abs(capacity)) & (capacity > 0))
    assert hopeless == (not could_fit) or borderline
    if np.any((need <= units(capacity - consumed - allocated, up=False)) & (capacity > 0)):
        assert not hopeless
