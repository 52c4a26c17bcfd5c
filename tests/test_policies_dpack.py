"""DPack (Tholoniat et al., EuroSys'25; docs/design.md §4.2): best orders, efficiency, refreshes,
and the incremental pass against a literal reference."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.budgets.exact import units
from privsched.policies import DPack, Snapshot, admit_in_order, make_policy, solve_optimal
from privsched.policies.admission import EdgeTable
from privsched.policies.base import Quotas
from privsched.policies.dpack import best_orders
from privsched.policies.packing import Packing
from tests.support.snapshots import make_snapshot, naive_admit, snapshots, spends_within

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
    snapshot = make_snapshot([{0: 0.5}, {0: 0.25}, {0: 0.25, 1: 0.5}, {0: 0.25}], unlocked=[4.0, 1.0], arrival=[0, 2, 3, 1])
    assert make_policy("dpack").policy.allocate(snapshot).granted.tolist() == [3, 1, 0, 2]


def test_dpack_weighs_pipelines_by_their_profit() -> None:
    snapshot = make_snapshot([{0: 0.25}, {0: 0.5}], unlocked=[4.0], weight=[1.0, 4.0])
    assert make_policy("dpack").policy.allocate(snapshot).granted.tolist() == [1, 0]


def test_a_block_without_budget_is_an_infinite_cost() -> None:
    snapshot = make_snapshot(
        [{0: [0.1, 0.1], 1: [0.0, 0.0]}, {0: [0.2, 0.2], 1: [0.1, 0.1]}, {0: [0.3, 0.3]}],
        unlocked=[[1.0, 1.0], [-1.0, 0.0]],
        capacity=[[1.0, 1.0], [1.0, 1.0]],
        accounting=RDP,
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


@settings(max_examples=40, deadline=None)
@given(snapshot=snapshots())
def test_a_k_beyond_the_queue_is_one_round_of_every_pipeline(snapshot: Snapshot) -> None:
    once = DPack(k=max(1, snapshot.n_pipelines)).allocate(snapshot).granted
    assert np.array_equal(DPack(k=10**30).allocate(snapshot).granted, once)


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots())
def test_dpack_leaves_no_pipeline_that_still_fits(snapshot: Snapshot) -> None:
    granted = DPack(k=2).allocate(snapshot).granted
    rest = np.setdiff1d(np.arange(snapshot.n_pipelines), granted)
    again = admit_in_order(snapshot, np.r_[granted, rest])
    assert np.array_equal(again, granted)


def reference_best_orders(snapshot: Snapshot, available: np.ndarray, waiting: set[int]) -> list[int]:
    """α*_j literally: per block and live order, sort the waiting demands, pack them
    smallest first while the running sum fits, count; the largest count wins, then the
    smallest order."""
    live = snapshot.accounting.live(snapshot.capacity)
    best = []
    for block in range(snapshot.n_blocks):
        on_block = [e for e in range(len(snapshot.edge_block)) if snapshot.edge_block[e] == block and snapshot.edge_pipeline[e] in waiting]
        counts = []
        for order in range(snapshot.accounting.dims):
            running, count = 0, 0
            for demand in sorted(int(units(snapshot.edge_demand[e, order], up=True)) for e in on_block):
                running += demand  # exact quanta, as the policies count
                count += bool(running <= available[block, order])
            counts.append(count if live[block, order] else -1)
        best.append(int(np.argmax(counts)))
    return best


def reference_dpack(snapshot: Snapshot, k: int) -> list[int]:
    """docs/design.md §4.2 literally: before every k grants, recount every block's best order over
    the pipelines not granted yet, recompute every efficiency, sort by descending
    efficiency (ties: arrival, id) and walk, one pipeline at a time, until k more grants."""
    accounting = snapshot.accounting
    live = accounting.live(snapshot.capacity)
    available = units(snapshot.unlocked, up=False).astype(float)  # exact quanta, as the policy counts
    demand = units(snapshot.edge_demand, up=True).astype(float)
    n = snapshot.n_pipelines
    edges_of = [[e for e in range(len(snapshot.edge_pipeline)) if snapshot.edge_pipeline[e] == p] for p in range(n)]
    arrival = sorted(range(n), key=lambda p: (snapshot.arrival[p], str(snapshot.pipeline_ids[p])))
    rank = {p: position for position, p in enumerate(arrival)}
    granted: list[int] = []
    while True:
        waiting = set(range(n)) - set(granted)
        best = reference_best_orders(snapshot, available, waiting) if accounting.is_rdp else None

        def edge_cost(e: int) -> float:
            block = snapshot.edge_block[e]
            orders = [best[block]] if best is not None else range(accounting.dims)
            ratios = [
                0.0 if demand[e, a] == 0 else demand[e, a] / available[block, a] if available[block, a] > 0 else np.inf for a in orders
            ]
            return max(ratios)

        def urgency(p: int) -> float:
            costs = [edge_cost(e) for e in edges_of[p]]
            # Summed in NumPy's reduction order, as the policy sums (the last bit decides exact ties).
            cost = float(np.add.reduceat(np.array(costs), [0])[0]) if costs else 0.0
            weight = float(snapshot.weight[p])
            if weight <= 0:
                return 0.0
            return -np.inf if cost == 0 else -weight / cost

        new = 0
        for p in sorted(waiting, key=lambda p: (urgency(p), rank[p])):
            blocks = [snapshot.edge_block[e] for e in edges_of[p]]
            if all(accounting.fits_units(demand[e], available[b], live[b]) for e, b in zip(edges_of[p], blocks)):
                for e, b in zip(edges_of[p], blocks):
                    available[b] = available[b] - demand[e]
                granted.append(p)
                new += 1
                if new == k:
                    break
        if new < k:
            return granted


def reweighted(snapshot: Snapshot, weight: list[float]) -> Snapshot:
    return Snapshot(**{**snapshot.__dict__, "weight": np.array(weight, dtype=float)})


@settings(max_examples=200, deadline=None)
@given(snapshot=snapshots(), k=st.sampled_from([1, 2, 3, 50]), data=st.data())
def test_dpack_equals_the_literal_reference_pass(snapshot: Snapshot, k: int, data) -> None:
    weights = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=snapshot.n_pipelines, max_size=snapshot.n_pipelines))
    snapshot = reweighted(snapshot, weights)
    assert DPack(k=k).allocate(snapshot).granted.tolist() == reference_dpack(snapshot, k)


def crowded_snapshot(seed: int, budget: tuple[int, int], max_blocks: int) -> Snapshot:
    """Three hundred weighted RDP pipelines on a dozen blocks, half of them cheap at α = 2
    and half cheap at α = 8, so that blocks change their best order as heavy pipelines are
    granted and the costs of the others on them fall. Every number is a multiple of 1/8,
    so every sum is exact."""
    rng = np.random.default_rng(seed)
    shapes = np.array([[1, 4, 8], [8, 4, 1]]) / 8
    demands, weight = [], []
    for _ in range(300):
        blocks = rng.choice(12, size=rng.integers(1, max_blocks + 1), replace=False)
        shape = shapes[int(rng.uniform() > 0.5)]
        demands.append({int(b): (shape * rng.integers(1, 4)).tolist() for b in blocks})
        weight.append(float(rng.choice([1, 1, 1, 4, 8])))
    unlocked = rng.integers(*budget, size=(12, 3)).tolist()
    arrival = rng.integers(0, 50, size=300).tolist()
    return make_snapshot(demands, unlocked, accounting=Accounting.rdp((2.0, 4.0, 8.0)), arrival=arrival, weight=weight)


def test_dpack_equals_the_reference_on_crowded_blocks_whose_best_orders_shift() -> None:
    # The last case has pipelines on up to six blocks, several of whose best orders move in
    # one round: every moved order must be in place before any of them is re-evaluated.
    cases = [(2, (4, 12), 1, 15), (5, (4, 12), 3, 4), (4, (10, 30), 3, 4), (0, (10, 30), 3, 50), (0, (10, 30), 6, 4)]
    for seed, budget, max_blocks, k in cases:
        snapshot = crowded_snapshot(seed, budget, max_blocks)
        granted = DPack(k=k).allocate(snapshot).granted
        assert 100 < len(granted) < 250
        assert granted.tolist() == reference_dpack(snapshot, k)


def test_best_orders_follow_the_grants() -> None:
    snapshot = crowded_snapshot(3, (10, 30), 3)
    table = EdgeTable.of(snapshot)
    available = units(snapshot.unlocked, up=False)  # exact quanta, as the policy counts
    packing = Packing(table, available.astype(float))
    granted = naive_admit(snapshot, np.random.default_rng(3).permutation(snapshot.n_pipelines))[:120]
    moved, waiting = 0, set(range(snapshot.n_pipelines))
    for chunk in np.array_split(granted, 12):
        edges, _ = table.gather(chunk)
        available = table.charge(available, chunk)
        packing.remove(edges)
        moved += len(packing.refresh(np.unique(table.block[edges]), available.astype(float)))
        waiting -= set(chunk.tolist())
        assert packing.best.tolist() == reference_best_orders(snapshot, available, waiting)
    assert moved > 0


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0.0, 1e6, allow_subnormal=False) | st.sampled_from([0.1, 1 / 3, np.inf]), min_size=1, max_size=300))
def test_a_pipelines_cost_is_summed_as_numpy_sums_it(values: list[float]) -> None:
    """The compiled pass sums a pipeline's edge costs in NumPy's order, bit for bit (the
    last bit decides exact ties between efficiencies)."""
    from privsched.policies.dpack_kernels import segment_sum

    array = np.array(values)
    assert segment_sum(array, 0, len(array)) == np.add.reduceat(array, [0])[0]


def test_the_area_cost_prefers_narrow_pipelines_on_nested_blocks_as_the_design_says() -> None:
    """docs/design.md §4.2 sums a pipeline's costs over its blocks. When every pipeline asks for the
    newest block and wide ones also for an older block (the heterogeneous workload's "last
    k blocks"), the older block's budget counts against the wide pipelines although nothing
    else wants it: DPack grants the narrow ones, DPF and the optimum the wide ones.
    Both blocks pack best at α = 8 (four wide demands fit there, two at α = 2)."""
    wide, narrow = {0: [0.5, 0.25], 1: [0.5, 0.25]}, {1: [0.9, 0.45]}
    snapshot = make_snapshot([wide] * 4 + [narrow] * 4, unlocked=[[1.0, 1.0], [1.0, 1.0]], accounting=RDP)
    assert best_orders(snapshot).tolist() == [1, 1]
    # Costs at α = 8: wide 0.25 + 0.25 = 0.5, narrow 0.45. Two narrow ones fill the newest block.
    assert DPack(k=50).allocate(snapshot).granted.tolist() == reference_dpack(snapshot, 50) == [4, 5]
    # Recounting after the first grant: wide 0.25 + 0.25 / 0.55 < narrow 0.45 / 0.55.
    assert DPack(k=1).allocate(snapshot).granted.tolist() == reference_dpack(snapshot, 1) == [4, 0, 1]
    assert sorted(make_policy("dpf-n", n=1).policy.allocate(snapshot).granted.tolist()) == [0, 1, 2, 3]
    assert solve_optimal(snapshot).objective == 4


def test_frequent_refreshes_under_quotas_look_up_each_twin_edges_pipeline() -> None:
    # A recount after a grant re-evaluates the pipelines on the blocks it touched, quota
    # twins included: every edge, twin or not, must name its own pipeline.
    rdp = Accounting.rdp((2.0, 4.0, 8.0))
    snapshot = make_snapshot(
        [
            {},
            {0: [0.0, 1.75, 0.5]},
            {},
            {0: [1.5, 1.75, 0.75]},
            {0: [1.25, 0.25, 0.0]},
            {0: [2.0, 1.0, 1.75]},
            {},
            {0: [0.0, 0.5, 1.0]},
            {},
        ],
        unlocked=[[0.0, 0.0, 0.0]],
        capacity=[[0.0, 0.5, 1.25]],
        accounting=rdp,
    )
    quotas = Quotas(team=np.array([0, 0, -1, 0, 0, -1, 0, -1, 0]), share=np.array([0.0]), held=np.array([[[0.0625, 0.125, 0.0]]]))
    snapshot = replace(snapshot, quotas=quotas)
    granted = DPack(k=2).allocate(snapshot).granted
    # Nothing is unlocked: granted are those that ask for nothing, at some live order.
    assert sorted(granted.tolist()) == sorted(DPack(k=50).allocate(snapshot).granted.tolist()) == [0, 2, 4, 6, 8]
