"""The event loop: unlock rules, event order within an instant, timeouts, reservations,
and the equivalence of its shortcuts with one full pass at every instant."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from privsched.budgets import Accounting
from privsched.budgets.accounting import RELATIVE_TOLERANCE
from privsched.policies import Allocation, PolicySpec, Snapshot, UnlockAll, admit_in_order, make_policy
from privsched.simulation import SimulationResult, parse_trace, resolve_policy, run, simulate
from privsched.simulation.api import load_workload
from privsched.simulation.skipping import rank_everyone
from privsched.budgets.exact import units
from privsched.simulation.watch import fits_under


@dataclass(frozen=True)
class ArrivalOrder:
    """A minimal FCFS written against the policy contract only."""

    name: str = "arrival-order"

    def allocate(self, snapshot: Snapshot) -> Allocation:
        return Allocation(granted=admit_in_order(snapshot, np.argsort(snapshot.arrival, kind="stable")))


@dataclass(frozen=True)
class GrantEveryone:
    """A broken policy: grants every pending pipeline whatever the budget."""

    name: str = "grant-everyone"

    def allocate(self, snapshot: Snapshot) -> Allocation:
        return Allocation(granted=np.arange(snapshot.n_pipelines))


ARRIVAL_ORDER = PolicySpec("arrival-order", ArrivalOrder(), UnlockAll())


def trace(*pipelines, epsilon: float = 1.0) -> dict:
    """One block at time 0 and pipelines given as (arrival, ε, timeout)."""
    return parse_trace(
        {
            "accounting": "basic",
            "blocks": [{"id": "b", "arrival": 0.0, "epsilon": epsilon}],
            "pipelines": [
                {"id": f"p{i}", "arrival": t, "blocks": ["b"], "epsilon": e, "timeout": timeout}
                for i, (t, e, timeout) in enumerate(pipelines)
            ],
        }
    )


def outcome(result: SimulationResult) -> list[tuple[str, float | None]]:
    return [(s, None if np.isnan(t) else float(t)) for s, t in zip(result.status, result.grant_time)]


def test_budget_is_granted_in_arrival_order_until_it_runs_out():
    result = simulate(trace((1, 0.4, 10), (2, 0.4, 10), (3, 0.4, 10)), ARRIVAL_ORDER)
    assert outcome(result) == [("granted", 1.0), ("granted", 2.0), ("timed_out", None)]
    assert result.block_used.tolist() == pytest.approx([0.8])


def test_per_arrival_unlock_releases_a_fair_share_per_pipeline():
    result = simulate(trace((1, 0.5, 99), (2, 0.5, 99), (3, 0.5, 99), (4, 0.5, 99)), "dpf-n", n=4)
    assert outcome(result) == [("granted", 2.0), ("granted", 4.0), ("timed_out", None), ("timed_out", None)]


def test_per_time_unlock_grants_once_enough_has_unlocked():
    result = simulate(trace((0.5, 0.35, 99)), "dpf-t", lifetime=10.0, tick=1.0)
    assert outcome(result) == [("granted", 4.0)]


def test_timeouts_apply_before_the_pass_of_the_same_instant():
    result = simulate(trace((0, 0.6, 5), (5, 0.1, 99)), "dpf-n", n=2)
    assert outcome(result) == [("timed_out", None), ("granted", 5.0)]


def test_a_pipeline_without_timeout_that_never_fits_ends_pending_and_one_with_a_timeout_times_out():
    result = simulate(trace((1, 0.8, None), (2, 0.5, None), (3, 0.5, 1e9)), ARRIVAL_ORDER)
    assert outcome(result) == [("granted", 1.0), ("pending", None), ("timed_out", None)]
    assert result.summary()["pending"] == 1


def test_round_robin_loses_what_it_set_aside_for_a_timed_out_pipeline():
    result = simulate(trace((0, 0.8, 1), (2, 0.1, 99)), "rr-n", n=2)
    assert outcome(result) == [("timed_out", None), ("granted", 2.0)]
    assert result.block_wasted.tolist() == pytest.approx([0.5])
    assert result.block_used.tolist() == pytest.approx([0.1])


def test_a_policy_granting_beyond_capacity_is_stopped():
    spec = PolicySpec("grant-everyone", GrantEveryone(), UnlockAll())
    with pytest.raises(RuntimeError, match="more budget than a block holds"):
        simulate(trace((0, 0.6, 9), (0, 0.6, 9)), spec)


def test_duration_keeps_only_earlier_arrivals():
    result = simulate(trace((1, 0.1, 9), (2, 0.1, 9), (3, 0.1, 9)), ARRIVAL_ORDER, duration=2.5)
    assert result.pipeline_ids == ["p0", "p1"]


SMALL = {
    "multi-block": {"duration": 40.0},
    "multi-block-rdp": {"duration": 4.0},
    "heterogeneous": {"duration": 40.0, "rate": 8.0},
}
POLICIES = [
    ("fcfs", {}),
    ("dpf-n", {"n": 60}),
    ("dpf-t", {"lifetime": 20.0}),
    ("dpack", {"n": 60}),
    ("rr-n", {"n": 60}),
]


# Round robin is defined for basic accounting only.
CASES = [(w, p, kw) for w in SMALL for p, kw in POLICIES if w == "multi-block" or not p.startswith("rr")]


@pytest.mark.parametrize("workload,policy,params", CASES, ids=[f"{w}-{p}" for w, p, _ in CASES])
def test_shortcuts_grant_exactly_what_a_full_pass_at_every_instant_grants(workload, policy, params):
    _, instance = load_workload(workload, seed=3, **SMALL[workload])
    spec = resolve_policy(policy, **params)
    fast, reference = run(workload, instance, spec), run(workload, instance, spec, shortcuts=False)
    assert fast.granted > 0
    assert outcome(fast) == outcome(reference)
    np.testing.assert_allclose(fast.block_used, reference.block_used, atol=1e-12)
    assert fast.passes <= reference.passes


def test_a_policy_outside_the_registry_matches_the_registry_fcfs():
    _, instance = load_workload("multi-block", seed=5, duration=60.0)
    mine = run("multi-block", instance, ARRIVAL_ORDER)
    registry = run("multi-block", instance, make_policy("fcfs"))
    assert outcome(mine) == outcome(registry)


@pytest.mark.parametrize("policy,params", POLICIES[:4], ids=[p for p, _ in POLICIES[:4]])
def test_no_block_ever_holds_more_than_its_capacity(policy, params):
    result = simulate("heterogeneous", policy, seed=2, duration=60.0, rate=10.0, **params)
    assert result.granted > 0
    assert np.all(result.sample_used <= 1 + 1e-9)
    assert np.all(np.diff(result.sample_used, axis=0) >= -1e-12)  # consumed budget never comes back


def test_result_survives_a_json_round_trip():
    result = simulate(trace((1, 0.4, 10), (2, 0.7, 10)), ARRIVAL_ORDER)
    again = SimulationResult.from_json(result.to_json())
    assert outcome(again) == outcome(result)
    assert again.summary() == result.summary()


TIES = parse_trace(
    {
        "accounting": "basic",
        "blocks": [{"id": f"b{j}", "arrival": 0.0, "epsilon": 1.0 + j} for j in range(3)],
        "pipelines": [  # equal arrivals with ids out of trace order, equal dominant shares
            {
                "id": f"p{(7 * i) % 12:02d}",
                "arrival": float(i // 4),
                "blocks": [f"b{j}" for j in range(i % 3 + 1)],
                "demands": {"b0": 0.1, **({"b1": 0.1 * (1 + i % 2)} if i % 3 else {})},
                "epsilon": 0.05,
            }
            for i in range(12)
        ],
    }
)


@pytest.mark.parametrize("policy", ["fcfs", "dpf-n"])
@pytest.mark.parametrize("workload", ["ties", "heterogeneous", "multi-block-rdp"])
def test_ranking_every_pipeline_once_orders_any_subset_as_the_policy_does(policy, workload):
    if workload == "ties":
        instance = TIES.instance
    else:
        instance = load_workload(workload, seed=1, duration={"heterogeneous": 30.0}.get(workload, 3.0))[1]
    spec = make_policy(policy, n=10)
    rank = rank_everyone(instance, spec.policy)
    rng = np.random.default_rng(0)
    for _ in range(20):
        subset = np.flatnonzero(rng.random(instance.n_pipelines) < rng.uniform(0.05, 0.8))
        snapshot, _ = instance.snapshot(subset, instance.capacity)
        assert subset[spec.policy.order(snapshot)].tolist() == subset[np.argsort(rank[subset])].tolist()


@pytest.mark.parametrize("accounting", [Accounting.basic(), Accounting.rdp([2.0, 4.0, 8.0])])
def test_the_simulators_fit_test_is_the_accountings_including_at_the_tolerance(accounting):
    rng = np.random.default_rng(1)
    rows, dims = 4000, accounting.dims
    available = rng.choice([0.0, 1e-12, 0.3, 1.0, -0.2], size=(rows, dims)) * rng.uniform(0.5, 2, size=(rows, dims))
    # demands on both sides of each budget, within and beyond the relative tolerance
    nudge = rng.choice([-3, -1, -0.5, 0, 0.5, 1, 1.5, 3, 1e6], size=(rows, dims)) * RELATIVE_TOLERANCE
    demand = np.abs(available * (1 + nudge) + rng.choice([0.0, 1e-3], size=(rows, dims)))
    live = rng.random((rows, dims)) < 0.8
    expected = accounting.fits(demand, available, live)
    assert 0 < expected.sum() < rows
    # the simulator keeps demands and balances in quanta and compares them plainly
    quanta = units(demand, up=True).astype(float), units(available, up=False).astype(float)
    np.testing.assert_array_equal(fits_under(accounting.is_rdp, *quanta, live), expected)
