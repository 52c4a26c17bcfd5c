"""The MILP optimum (docs/design.md §4.2): proven on small instances, never beaten online."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from privsched.budgets.accounting import Accounting
from privsched.policies import Snapshot, admit_in_order, make_policy, solve_optimal
from tests.support.snapshots import make_snapshot, snapshots


def test_optimum_packs_two_halves_where_first_come_first_served_takes_the_big_one() -> None:
    snapshot = make_snapshot([{0: 0.6}, {0: 0.5}, {0: 0.5}], unlocked=[1.0])
    result = solve_optimal(snapshot, time_limit=10)
    assert result.proven_optimal
    assert result.granted.tolist() == [1, 2]
    assert result.objective == pytest.approx(2.0)
    assert result.bound == pytest.approx(2.0)
    assert len(make_policy("fcfs").policy.allocate(snapshot).granted) == 1


def test_optimum_maximises_total_weight_not_count() -> None:
    snapshot = make_snapshot([{0: 0.6}, {0: 0.5}, {0: 0.5}], unlocked=[1.0], weight=[3.0, 1.0, 1.0])
    assert solve_optimal(snapshot, time_limit=10).granted.tolist() == [0]


def test_optimum_under_rdp_chooses_one_order_per_block() -> None:
    rdp = Accounting.rdp((2.0, 8.0))
    demands = [{0: [0.1, 0.9]} for _ in range(6)] + [{1: [0.9, 0.1]} for _ in range(6)]
    demands.append({0: [0.5, 0.5], 1: [0.5, 0.5]})  # fits only by displacing one on each block
    snapshot = make_snapshot(demands, unlocked=[[1.0, 1.0], [1.0, 1.0]], accounting=rdp)
    result = solve_optimal(snapshot, time_limit=10)
    assert result.proven_optimal
    assert result.granted.tolist() == list(range(12))


def test_optimal_policy_grants_the_whole_solution_within_budget() -> None:
    snapshot = make_snapshot([{0: 0.6, 1: 0.2}, {0: 0.5}, {0: 0.5, 1: 0.9}, {1: 0.3}], unlocked=[1.0, 1.0])
    granted = make_policy("optimal", time_limit=10).policy.allocate(snapshot).granted
    assert sorted(granted.tolist()) == solve_optimal(snapshot, 10).granted.tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots())
def test_optimum_is_proven_and_at_least_every_online_policy(snapshot: Snapshot) -> None:
    result = solve_optimal(snapshot, time_limit=20)
    assert result.proven_optimal
    assert np.array_equal(admit_in_order(snapshot, result.granted), result.granted)
    assert result.bound >= result.objective - 1e-6
    names = ["fcfs", "dpf-n", "dpack"] + ([] if snapshot.accounting.is_rdp else ["rr-n"])
    for name in names:
        granted = make_policy(name, n=1).policy.allocate(snapshot).granted
        assert result.objective >= snapshot.weight[granted].sum() - 1e-9, name


def test_empty_snapshot_is_trivially_optimal() -> None:
    result = solve_optimal(make_snapshot([], unlocked=[1.0]))
    assert result.proven_optimal and result.granted.size == 0 and result.objective == 0.0


def test_time_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="time_limit"):
        solve_optimal(make_snapshot([{0: 0.5}], unlocked=[1.0]), time_limit=0)
