"""A team at its quota never holds up another team (docs/design.md §4.2): the policies skip
the pipelines a quota holds back and go on to the next one, in the simulator and in the
live scheduler alike, and the waiting reason of a pipeline held back names the quota.

The workload: one block of ε = 1 fully unlocked; team blue (quota 0.3) asks for 0.2 four
times, then team red (no quota) asks for 0.5. Blue gets one grant (a second would hold 0.4);
red fits what is left and is granted at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import privsched as ps
from privsched.ledger import Ledger
from privsched.ledger.identities import Identities, User
from privsched.ledger.models import PipelineRequest
from privsched.budgets import Accounting
from privsched.policies import Snapshot, admit_in_order, make_policy
from privsched.policies.base import Quotas
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service.scheduler import Scheduler
from privsched.simulation.engine import Simulator
from privsched.simulation.status import STATUS_NAMES
from privsched.simulation.trace import parse_trace
from tests.support.executors import InstantExecutor

POLICIES = {"fcfs": {}, "dpf-n": {"n": 2}, "dpack-n": {"n": 2, "k": 2}, "rr-n": {"n": 2}}
WORKLOAD = [("blue", 0.0, 0.2)] * 4 + [("red", 1.0, 0.5)]  # (team, arrival, ε)


def trace() -> dict:
    return {
        "accounting": "basic",
        "blocks": [{"id": "b0", "arrival": 0.0, "epsilon": 1.0, "delta": 1e-6}],
        "pipelines": [
            {"id": f"p{i}", "arrival": t, "blocks": ["b0"], "epsilon": eps, "team": team} for i, (team, t, eps) in enumerate(WORKLOAD)
        ],
        "quotas": {"blue": 0.3},
    }


@pytest.mark.parametrize("policy", list(POLICIES))
def test_in_the_simulator_another_team_is_granted_while_one_team_sits_at_its_quota(policy: str):
    state = Simulator(parse_trace(trace()).instance, make_policy(policy, **POLICIES[policy]), samples=0).run()
    assert [STATUS_NAMES[s] for s in state.status] == ["granted", "pending", "pending", "pending", "granted"]
    assert state.grant_time[-1] == 1.0  # at its arrival
    assert state.consumed[0, 0] == pytest.approx(0.7)


def live_scheduler(path: Path, policy: str) -> tuple[Ledger, Scheduler, list[int]]:
    """The workload on a real ledger, each pipeline submitted in its team's name, the quota
    set by the admin; the live scheduler ticks at each arrival."""
    ledger = Ledger.init(path)
    dataset = ledger.create_dataset("d", 1.0, 1e-6, accounting="basic", now=0.0)
    ledger.add_blocks("d", ["b0"], now=0.0)
    with Identities(path) as identities:
        identities.set_quota(dataset.id, "blue", 0.3)
    scheduler = Scheduler(ledger, make_policy(policy, **POLICIES[policy]), InstantExecutor(), Pool((), cpus=1e6, memory=0), RunDirs(path))
    ids = []
    for now in (0.0, 1.0):
        for i, (team, t, eps) in enumerate(WORKLOAD):
            if t != now:
                continue
            request = PipelineRequest(f"p{i}", "d", ["b0"], demand=np.array([eps, 0.0]), job={"function": "instant:job"})
            claim = Identities.claim(ledger.db, [(User(f"member-{team}", "user", team, 0.0), None)])
            ids.extend(ledger.submit_many([request], now=now, claim=claim))
        scheduler.tick(now)
    return ledger, scheduler, ids


@pytest.mark.parametrize("policy", list(POLICIES))
def test_in_the_live_scheduler_another_team_is_granted_while_one_team_sits_at_its_quota(tmp_path: Path, policy: str):
    ledger, _, ids = live_scheduler(tmp_path / "q.db", policy)
    infos = {info.id: info for info in ledger.list_pipelines()}
    assert [infos[i].state for i in ids] == ["completed", "pending", "pending", "pending", "completed"]
    assert infos[ids[-1]].granted_at == 1.0  # at its arrival, not never
    assert ledger.audit().ok
    ledger.close()
    with ps.connect(tmp_path / "q.db") as client:
        reasons = client.reasons("d")
    held_back = [reasons[i] for i in ids[1:4]]
    assert {(r.code, r.team, r.block) for r in held_back} == {("quota", "blue", "b0")}
    assert all("quota" in r.text() for r in held_back)


def test_a_snapshot_whose_quotas_do_not_match_its_pipelines_is_refused():
    snapshot = Snapshot(
        accounting=Accounting.basic(),
        capacity=np.array([[1.0, 1e-6]]),
        unlocked=np.array([[1.0, 1e-6]]),
        pipeline_ids=np.arange(2),
        arrival=np.zeros(2),
        weight=np.ones(2),
        edge_pipeline=np.arange(2),
        edge_block=np.zeros(2, dtype=np.intp),
        edge_demand=np.full((2, 2), 0.1),
        quotas=Quotas(team=np.array([0, 1]), share=np.array([0.3]), held=np.zeros((1, 1, 2))),
    )
    with pytest.raises(ValueError, match="team is not among"):
        admit_in_order(snapshot, np.arange(2))
