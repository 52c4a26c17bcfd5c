"""FCFS and DPF orders, their tie-breaks, and the OSDI'21 worked example (docs/design.md §4.2)."""

from __future__ import annotations

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.policies import Snapshot, dpf_order, make_policy
from tests.support.snapshots import make_snapshot


def test_fcfs_grants_in_arrival_order_ties_by_id() -> None:
    snapshot = make_snapshot(
        [{0: 1.0}, {0: 1.0}, {0: 1.0}, {0: 1.0}],
        unlocked=[3.0],
        arrival=[5.0, 1.0, 1.0, 0.0],
        ids=["d", "c", "b", "a"],
    )
    assert make_policy("fcfs").policy.allocate(snapshot).granted.tolist() == [3, 2, 1]


def test_fcfs_is_best_effort_a_large_early_pipeline_does_not_block_later_ones() -> None:
    snapshot = make_snapshot([{0: 5.0}, {0: 1.0}], unlocked=[2.0])
    assert make_policy("fcfs").policy.allocate(snapshot).granted.tolist() == [1]


def test_dpf_serves_the_smallest_dominant_share_first() -> None:
    snapshot = make_snapshot([{0: 2.0}, {0: 0.5, 1: 1.0}, {1: 0.25}], unlocked=[4.0, 4.0])
    assert dpf_order(snapshot).tolist() == [2, 1, 0]


def test_dpf_shares_are_relative_to_capacity_not_to_what_remains() -> None:
    # Block 0 is nearly empty but large; block 1 is full but small.
    snapshot = make_snapshot([{0: 1.0}, {1: 0.6}], unlocked=[1.0, 1.0], capacity=[10.0, 1.0])
    assert dpf_order(snapshot).tolist() == [0, 1]


def test_dpf_breaks_dominant_share_ties_on_the_remaining_shares_sorted_descending() -> None:
    snapshot = make_snapshot(
        [{0: 1.5, 1: 1.0}, {0: 0.5, 1: 1.5}, {0: 1.5, 1: 0.5, 2: 0.5}, {0: 1.5}],
        unlocked=[3.0, 3.0, 3.0],
        arrival=[0, 1, 2, 3],
    )
    # All dominant shares are 0.5; the next shares are 1/3, 1/6, 1/6 then 1/6, and 0.
    assert dpf_order(snapshot).tolist() == [3, 1, 2, 0]


def test_dpf_breaks_full_ties_by_arrival_then_id() -> None:
    snapshot = make_snapshot([{0: 1.0}, {0: 1.0}, {0: 1.0}], unlocked=[3.0], arrival=[2.0, 1.0, 1.0], ids=["a", "z", "m"])
    assert dpf_order(snapshot).tolist() == [2, 1, 0]


def test_dpf_under_rdp_ignores_dead_orders() -> None:
    rdp = Accounting.rdp((2.0, 4.0))
    snapshot = make_snapshot([{0: [100.0, 0.5]}, {0: [0.0, 0.6]}], unlocked=[[0.0, 1.0]], capacity=[[0.0, 1.0]], accounting=rdp)
    assert dpf_order(snapshot).tolist() == [0, 1]


def test_dpf_under_rdp_takes_the_largest_share_over_live_orders() -> None:
    rdp = Accounting.rdp((2.0, 4.0))
    snapshot = make_snapshot([{0: [0.9, 0.1]}, {0: [0.5, 0.5]}], unlocked=[[1.0, 1.0]], accounting=rdp)
    assert dpf_order(snapshot).tolist() == [1, 0]


def _drive_per_arrival(policy_name: str, n: int, capacity: float, arrivals: list[tuple[float, dict]]) -> dict:
    """Play arrivals through the unlock rule and the policy as a scheduler would; returns
    each pipeline's grant time (None while it waits)."""
    spec = make_policy(policy_name, n=n)
    n_blocks = 1 + max(b for _, wants in arrivals for b in wants)
    cap = np.tile([capacity, 1e-6], (n_blocks, 1))
    unlocked = cap * spec.unlock.on_block_created()
    pending: list[int] = []
    granted_at: dict[int, float | None] = {}
    for i, (t, wants) in enumerate(arrivals):
        for b in wants:
            unlocked[b] = np.minimum(cap[b], unlocked[b] + spec.unlock.on_pipeline_arrival() * cap[b])
        pending.append(i)
        granted_at[i] = None
        snapshot = make_snapshot(
            [arrivals[p][1] for p in pending],
            unlocked.tolist(),
            cap.tolist(),
            arrival=[arrivals[p][0] for p in pending],
            ids=[f"P{p + 1}" for p in pending],
        )
        snapshot = Snapshot(**{**snapshot.__dict__, "clock": t})
        for g in spec.policy.allocate(snapshot).granted:
            pipeline = pending[g]
            for b, d in arrivals[pipeline][1].items():
                unlocked[b, 0] -= d
            granted_at[pipeline] = t
        pending = [p for p in pending if granted_at[p] is None]
    return granted_at


def test_worked_example_dpf_n_grants_p2_then_p1_and_p3_waits() -> None:
    # Luo et al., OSDI'21: two blocks of capacity 3, N = 3 (fair share 1).
    arrivals = [(1.0, {0: 0.5, 1: 1.5}), (2.0, {0: 1.0, 1: 1.0}), (3.0, {0: 1.5, 1: 1.0})]
    assert _drive_per_arrival("dpf-n", 3, 3.0, arrivals) == {0: 3.0, 1: 2.0, 2: None}
