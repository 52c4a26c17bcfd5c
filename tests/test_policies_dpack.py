"""DPack (Tholoniat et al., EuroSys'25; DESIGN §4.2): best orders, efficiency, refreshes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from privsched.budgets.accounting import Accounting
from privsched.policies import DPack, Snapshot, admit_in_order, make_policy
from privsched.policies.dpack import best_orders
from tests.test_policies_admission import make_snapshot, snapshots, spends_within

RDP = Accounting.rdp((2.0, 8.0))


def heterogeneous() -> Snapshot:
    """Block 0 packs best at α = 2, block 1 at α = 8; one balanced pipeline per block
    has the smallest dominant share but spends budget at both orders."""
    demands = [{0: [0.5, 0.5]}, {1: [0.5, 0.5]}]
    demands += [{0: [0.1, 0.9]} for _ in range(10)] + [{1: [0.9, 0.1]} for _ in range(10)]
    return make_snapshot(demands, unlocked=[[1.0, 1.0], [1.0, 1.0]], accounting=RDP)


def test_dpack_picks_each_blocks_best_order() -> None:
    assert best_orders(heterogeneous()).tolist() == [0, 1]


def test_best_order_ties_go_to_the_smallest_order() -> None:
    snapshot = make_snapshot([{0: [0.5, 0.5]}, {0: [0.5, 0.5]}], unlocked=[[1.0, 1.0]], accounting=RDP)
    assert best_orders(snapshot).tolist() == [0]


def test_dpack_beats_dpf_on_heterogeneous_blocks() -> None:
    snapshot = heterogeneous()
    dpack = make_policy("dpack").policy.allocate(snapshot).granted
    dpf = make_policy("dpf-n", n=1).policy.allocate(snapshot).granted
    assert sorted(dpack.tolist()) == list(range(2, 22))
    assert len(dpf) == 12


def test_dpack_admits_in_descending_efficiency_ties_by_arrival() -> None:
    snapshot = make_snapshot(
        [{0: 0.5}, {0: 0.25}, {0: 0.25, 1: 0.5}, {0: 0.25}], unlocked=[4.0, 1.0], arrival=[0, 2, 3, 1]
    )
    assert make_policy("dpack").policy.allocate(snapshot).granted.tolist() == [3, 1, 0, 2]


def test_dpack_weighs_pipelines_by_their_profit() -> None:
    snapshot = make_snapshot([{0: 0.25}, {0: 0.5}], unlocked=[4.0], weight=[1.0, 4.0])
    assert make_policy("dpack").policy.allocate(snapshot).granted.tolist() == [1, 0]


def test_a_block_without_budget_is_an_infinite_cost() -> None:
    snapshot = make_snapshot(
        [{0: [0.1, 0.1], 1: [0.0, 0.0]}, {0: [0.2, 0.2], 1: [0.1, 0.1]}, {0: [0.3, 0.3]}],
        unlocked=[[1.0, 1.0], [-1.0, 0.0]], capacity=[[1.0, 1.0], [1.0, 1.0]], accounting=RDP,
    )
    assert make_policy("dpack").policy.allocate(snapshot).granted.tolist() == [0, 2]


def test_efficiencies_are_refreshed_every_k_grants() -> None:
    snapshot = make_snapshot(
        [
            {0: [0.7, 0.5], 1: [0.1, 0.2]},
            {0: [0.9, 0.3], 1: [0.4, 0.3]},
            {1: [0.5, 0.9]},
            {0: [0.1, 0.4], 1: [0.5, 0.9]},
        ],
        unlocked=[[1.0, 1.0], [1.0, 1.0]],
        accounting=RDP,
    )
    # Initial efficiencies (α* = 2 on both blocks): 2 > 3 > 0 > 1. With one refresh per
    # grant, granting 2 leaves block 1 short at α = 2, so 0 overtakes 3, and 1 then fits at
    # α = 8 on block 0.
    assert DPack(k=50).allocate(snapshot).granted.tolist() == [2, 3]
    assert DPack(k=1).allocate(snapshot).granted.tolist() == [2, 0, 1]


@settings(max_examples=100, deadline=None)
@given(snapshot=snapshots())
def test_dpack_never_overspends(snapshot: Snapshot) -> None:
    for k in (1, 3, 50):
        granted = DPack(k=k).allocate(snapshot).granted
        assert len(set(granted.tolist())) == len(granted)
        assert spends_within(snapshot, granted)


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots())
def test_dpack_leaves_no_pipeline_that_still_fits(snapshot: Snapshot) -> None:
    granted = DPack(k=2).allocate(snapshot).granted
    rest = np.setdiff1d(np.arange(snapshot.n_pipelines), granted)
    again = admit_in_order(snapshot, np.r_[granted, rest])
    assert np.array_equal(again, granted)
