"""Budget bars: the fractions a block's stacked bar shows, at the right dimension."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.dashboard.bars import BUCKETS, budget_bar, reference_dimension
from privsched.ledger import BlockInfo

BASIC = Accounting("basic")
RDP = Accounting("rdp", (2.0, 4.0, 8.0))


def block(capacity, consumed, allocated, unlocked) -> BlockInfo:
    capacity, consumed, allocated, unlocked = (np.asarray(v, dtype=float) for v in (capacity, consumed, allocated, unlocked))
    locked = capacity - consumed - allocated - unlocked
    return BlockInfo(1, "d", "k", None, "active", 0.0, capacity, locked, unlocked, allocated, consumed)


def test_basic_accounting_shows_the_binding_dimension():
    # 20 % of ε given out but 60 % of δ: δ binds.
    bar = budget_bar(block([10, 1e-6], [1, 4e-7], [1, 2e-7], [3, 1e-7]), BASIC)
    assert bar.dimension == "δ"
    assert (bar.consumed, bar.allocated, bar.unlocked) == (0.4, 0.2, 0.1)
    assert abs(bar.locked - 0.3) < 1e-12


def test_rdp_shows_the_best_order():
    # Order 8 has the most left (90 %), so the bar reads there, even though order 2 is spent.
    capacity = [1.0, 2.0, 4.0]
    bar = budget_bar(block(capacity, [1.0, 1.0, 0.4], [0, 0, 0], [0, 0.5, 1.0]), RDP)
    assert bar.dimension == "α=8"
    assert (bar.consumed, bar.unlocked) == (0.1, 0.25)


def test_dead_orders_are_never_the_reference():
    capacity = [-1.0, 2.0, 1.0]
    info = block(capacity, [0, 1.5, 0.9], [0, 0, 0], [0, 0, 0])
    assert reference_dimension(info, RDP) == 1


def test_a_negative_unlocked_balance_is_drawn_as_empty():
    bar = budget_bar(block([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0], [-0.2, -0.2, -0.2]), RDP)
    assert bar.unlocked == 0.0 and bar.consumed == 0.5


fractions = st.floats(0, 1)


@given(st.lists(st.tuples(fractions, fractions, fractions), min_size=3, max_size=3), st.booleans())
def test_bars_are_shares_that_never_exceed_the_capacity(shares, rdp):
    accounting = RDP if rdp else BASIC
    rows = shares if rdp else shares[:2]
    capacity = np.array([3.0, 5.0, 7.0])[: len(rows)]
    consumed, allocated, unlocked = (np.array([row[i] for row in rows]) * capacity for i in range(3))
    info = block(capacity, consumed, allocated, unlocked)
    bar = budget_bar(info, accounting)
    values = [getattr(bar, bucket) for bucket in BUCKETS]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert sum(values) <= 1.0 + 1e-12
    d = reference_dimension(info, accounting)
    assert bar.consumed == min(consumed[d] / capacity[d], 1.0)
