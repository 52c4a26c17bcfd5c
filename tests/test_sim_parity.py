"""The simulator and the live scheduler are one code path: the same trace, run by the
simulator and by ``Scheduler.tick`` on a real ledger at the same clock instants, grants the
same pipelines at the same times and times out the same ones (docs/design.md §6.4)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from privsched.ledger import Ledger
from privsched.ledger.identities import Identities, User
from privsched.ledger.models import PipelineRequest
from privsched.policies import PolicySpec, make_policy
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service.scheduler import Scheduler
from privsched.simulation.engine import Simulator
from privsched.simulation.status import STATUS_NAMES
from privsched.simulation.instance import Instance
from tests.support.executors import InstantExecutor
from tests.support.traces import GLOBAL_BUDGET, random_trace

POLICIES = {
    "fcfs": {},
    "dpf-n": {"n": 4},
    "dpf-t": {"lifetime": 20.0},
    "dpack-n": {"n": 4, "k": 3},
    "dpack-t": {"lifetime": 20.0, "k": 3},
}


def simulate(instance: Instance, spec: PolicySpec, tick: float) -> tuple[Simulator, list[str], np.ndarray]:
    simulator = Simulator(instance, spec, tick=tick, samples=0)
    state = simulator.run()
    return simulator, [STATUS_NAMES[s] for s in state.status], state.grant_time


def live(
    path: Path,
    instance: Instance,
    accounting: str,
    spec: PolicySpec,
    simulator: Simulator,
    teams: dict[str, str] | None = None,
    quotas: dict[str, float] | None = None,
):
    """Replay the trace on a ledger: blocks and pipelines recorded at their arrival, and one
    tick at each instant the simulator may act (arrivals and its unlock grid), then one tick
    after every deadline. ``teams`` (pipeline id → team) are recorded as the pipelines'
    submitters' teams, under ``quotas`` (team → share). Returns each pipeline's final state
    and grant time."""
    ledger = Ledger.init(path)
    epsilon, delta = GLOBAL_BUDGET[accounting]
    dataset = ledger.create_dataset("d", epsilon, delta, accounting=accounting, now=0.0)
    if quotas:
        with Identities(path) as identities:
            for team, share in quotas.items():
                identities.set_quota(dataset.id, team, share)
    scheduler = Scheduler(ledger, spec, InstantExecutor(), Pool((), cpus=1e6, memory=0), RunDirs(path), unlock_grid=simulator.grid)
    block_keys = [str(b) for b in instance.block_ids]
    instants = set(instance.block_arrival.tolist()) | set(instance.arrival.tolist())
    if simulator.grid is not None:
        horizon = max(instants) + 2 / spec.unlock.on_tick(1.0)
        instants |= {simulator.grid.instant(k) for k in range(1, simulator.grid.index(horizon) + 1)}
    timeouts = instance.timeout[np.isfinite(instance.timeout)]
    instants.add(float(instance.arrival.max() + timeouts.max(initial=0.0)) + 1.0)
    ids = []
    least = instance.elastic_min
    for now in sorted(instants):
        arriving = [j for j, t in enumerate(instance.block_arrival.tolist()) if t == now]
        if arriving:
            ledger.add_blocks("d", [block_keys[j] for j in arriving], now=now)
            assert np.array_equal(ledger.get_block("d", block_keys[arriving[0]]).capacity, instance.capacity[arriving[0]])
        for i in np.flatnonzero(instance.arrival == now).tolist():
            edges = range(instance.edge_start[i], instance.edge_start[i + 1])
            demands = {block_keys[instance.edge_block[e]]: instance.edge_demand[e] for e in edges}
            timeout = float(instance.timeout[i]) if np.isfinite(instance.timeout[i]) else None
            name = str(instance.pipeline_ids[i])
            team = (teams or {}).get(name)
            elastic_min = None if least is None or least[i] >= 1 else float(least[i])
            request = PipelineRequest(
                name=name,
                dataset="d",
                block_keys=list(demands),
                demands=demands,
                timeout=timeout,
                job={"function": "instant:job"},
                elastic_min=elastic_min,
            )
            claim = None if team is None else Identities.claim(ledger.db, [(User(f"member-{team}", "user", team, 0.0), None)])
            ids.extend(ledger.submit_many([request], now=now, claim=claim))
        scheduler.tick(now)
    infos = {info.id: info for info in ledger.list_pipelines()}
    ledger.close()
    states = [infos[i].state for i in ids]
    fractions = np.array([np.nan if infos[i].granted_at is None else infos[i].fraction or 1.0 for i in ids])
    return states, np.array([np.nan if infos[i].granted_at is None else infos[i].granted_at for i in ids]), fractions


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("accounting", ["basic", "rdp"])
@pytest.mark.parametrize("seed", [0, 1])
def test_simulator_and_live_scheduler_grant_the_same_pipelines_at_the_same_times(tmp_path: Path, accounting: str, policy: str, seed: int):
    instance = random_trace(accounting, seed).instance
    spec = make_policy(policy, **POLICIES[policy])
    simulator, sim_states, sim_times = simulate(instance, spec, tick=2.5)
    live_states, live_times, _ = live(tmp_path / "parity.db", instance, accounting, spec, simulator)

    granted = [s == "granted" for s in sim_states]
    assert 0 < sum(granted) < len(granted)  # the trace is contended: not everyone gets in
    assert [s in ("granted", "running", "completed") for s in live_states] == granted
    np.testing.assert_array_equal(live_times, sim_times)
    # The live scheduler also ends, as failed, a pipeline no future unlock can satisfy; the
    # simulator keeps it waiting until its timeout. Either way it is never granted.
    waiting = [(live_state, sim_state) for live_state, sim_state in zip(live_states, sim_states) if sim_state != "granted"]
    assert all(live_state in (sim_state, "failed") for live_state, sim_state in waiting)


QUOTAS = {"blue": 0.2, "red": 0.35}


@pytest.mark.parametrize("policy", ["fcfs", "dpf-n", "dpf-t", "dpack-n"])
@pytest.mark.parametrize("accounting", ["basic", "rdp"])
def test_under_team_quotas_the_simulator_and_live_scheduler_grant_the_same_pipelines_at_the_same_times(
    tmp_path: Path, accounting: str, policy: str
):
    trace = random_trace(accounting, 3, quotas=QUOTAS)
    instance = trace.instance
    spec = make_policy(policy, **POLICIES[policy])
    simulator, sim_states, sim_times = simulate(instance, spec, tick=2.5)
    _, unbounded, _ = simulate(replace(instance, team=None, share=None), spec, tick=2.5)
    assert sim_states != unbounded  # the quotas change what is granted
    teams = {p.id: p.team for p in trace.pipelines if p.team is not None}
    live_states, live_times, _ = live(tmp_path / "parity.db", instance, accounting, spec, simulator, teams, QUOTAS)

    granted = [s == "granted" for s in sim_states]
    assert 0 < sum(granted) < len(granted)
    assert [s in ("granted", "running", "completed") for s in live_states] == granted
    np.testing.assert_array_equal(live_times, sim_times)


# FCFS under RDP grants this trace's every pipeline its whole range: nothing to compare.
@pytest.mark.parametrize(
    ("accounting", "policy"), [("basic", "fcfs"), ("basic", "dpf-n"), ("basic", "dpack-n"), ("rdp", "dpf-n"), ("rdp", "dpack-n")]
)
def test_with_elastic_demands_the_simulator_and_live_scheduler_grant_the_same_fractions_at_the_same_times(
    tmp_path: Path, accounting: str, policy: str
):
    instance = random_trace(accounting, 4).instance
    least = np.random.default_rng(4).choice([0.3, 0.5, 0.8, 1.0], size=len(instance.pipeline_ids))
    instance = replace(instance, elastic_min=least)
    spec = make_policy(policy, **POLICIES[policy])
    simulator, sim_states, sim_times = simulate(instance, spec, tick=2.5)
    live_states, live_times, live_fractions = live(tmp_path / "parity.db", instance, accounting, spec, simulator)

    granted = [s == "granted" for s in sim_states]
    assert 0 < sum(granted) < len(granted)
    assert [s in ("granted", "running", "completed") for s in live_states] == granted
    np.testing.assert_array_equal(live_times, sim_times)
    sim_fractions = np.where(granted, simulator.fraction, np.nan)
    assert np.nanmin(sim_fractions) < 1  # some pipeline was granted less than its maximum
    # The ledger keeps budgets as floats on the quantum grid, the simulator as exact quanta:
    # what is left may differ by a few quanta (10⁻¹²), and a top-up's fraction with it.
    np.testing.assert_allclose(live_fractions, sim_fractions, rtol=1e-8)
