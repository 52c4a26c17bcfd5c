"""Unlock estimates that what holds a pipeline back could not meet are not given: a team at
its quota waits with the quota as its reason (no unlock lifts it), and under round robin a
pipeline fits once the unreserved budget fills it beside the others waiting on its block,
counting what the scheduler has already set aside. Checked on real ledgers against the live
scheduler."""

from __future__ import annotations

import pytest

import privsched as ps
from privsched.policies import make_policy
from privsched.service.resources import Pool
from privsched.service.scheduler import Scheduler
from privsched.service.waiting import ARRIVALS_SHARE
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture
from tests.support.executors import InstantExecutor
from tests.test_waiting_outlook import database, pipeline

LIFETIME = 1000.0


def round_robin(client: ps.Client) -> Scheduler:
    """The live RR-T scheduler over the client's database; its jobs end as they start."""
    live = Scheduler(client.ledger, make_policy("rr-t", lifetime=LIFETIME), InstantExecutor(), Pool((), 4.0, 0), client.runs)
    live.recover(0.0)
    return live


def granted(client: ps.Client, run_id: int) -> bool:
    return client.status(run_id).state != "pending"


def test_a_team_at_its_quota_gets_the_quota_as_its_reason_and_no_unlock_estimate(server: Server):
    with ps.connect(server.db) as local:
        local.create_dataset("fresh", epsilon=1.0, delta=1e-6, accounting="basic")
        local.add_blocks("fresh", ["c0"])  # nothing unlocked
        served = make_policy("dpf-t", lifetime=LIFETIME)
        local.runs.record_policy(served.name, served.params)
    admin, alice, bob, rita = (ps.connect(server.url, token=server.tokens[u]) for u in ("admin", "alice", "bob", "rita"))
    admin.set_quota("fresh", "blue", 0.5)
    held = alice.submit(spec(dataset="fresh", blocks=["c0"], epsilon=0.4))
    with ps.connect(server.db) as local:
        local.unlock("fresh", 0.4)
        assert local.ledger.grant([held.id]) == [held.id]  # team blue holds 0.4 of c0
        over = bob.submit(spec(dataset="fresh", blocks=["c0"], epsilon=0.3))  # blue: 0.7 > 0.5
        other = rita.submit(spec(dataset="fresh", blocks=["c0"], epsilon=0.3))  # team red: no quota
        created = local.blocks("fresh")[0].created_at
        here = local.reasons("fresh")
        alone = {i: local.reasons("fresh", pipeline_id=i) for i in (held.id, over.id, other.id)}
    assert alone == {i: {i: here[i]} for i in here} and len(here) == 3  # each alone, as among all (the granted one: compute)
    assert bob.reasons("fresh", pipeline_id=other.id) == {other.id: here[other.id]}
    why, theirs = bob.reasons("fresh")[over.id], here[other.id]
    assert (why.code, why.team, why.block, why.unlock, why.fits_at) == ("quota", "blue", "c0", None, None)
    assert "no unlock lifts it" in why.text() and why.short() == "quota blue c0"
    assert (theirs.code, theirs.unlock) == ("budget", "time")  # short of budget, by the same unlock
    assert theirs.fits_at == pytest.approx(created + 0.7 * LIFETIME, abs=1.0)
    assert {k: v.to_dict() for k, v in bob.reasons("fresh").items()} == {k: v.to_dict() for k, v in here.items()}
    with ps.connect(server.db) as local:
        local.unlock("fresh", 1.0)  # everything unlocked: the quota still refuses
        assert local.ledger.grant([over.id, other.id]) == [other.id]
        assert local.reasons("fresh")[over.id].code == "quota"


def test_under_round_robin_a_pipeline_fits_once_the_others_on_its_block_have_their_shares(tmp_path):
    client = database(tmp_path / "p.db", serving=("rr-t", {"lifetime": LIFETIME}))
    big, small = client.submit(pipeline(["b0"], 0.6)), client.submit(pipeline(["b0"], 0.2))
    created = client.blocks("d")[0].created_at
    why = client.reasons("d")[big.id]
    assert (why.code, why.block, why.shares, why.unlock) == ("budget", "b0", 1, "time")
    assert why.demand == pytest.approx(0.8)  # its 0.6 and the 0.2 filled alongside
    assert why.fits_at == pytest.approx(created + 0.8 * LIFETIME, abs=1.0)  # not 0.6: the share of the other
    assert "with the round-robin shares of 1 other pipeline(s)" in why.text()
    live = round_robin(client)
    live.tick(why.fits_at - 0.01 * LIFETIME)
    assert granted(client, small.id) and not granted(client, big.id)
    live.tick(why.fits_at)
    assert granted(client, big.id)


def test_round_robin_estimates_count_what_the_scheduler_has_already_set_aside(tmp_path):
    client = database(tmp_path / "p.db", serving=("rr-t", {"lifetime": LIFETIME}))
    first = client.submit(pipeline(["b0"], 0.6))
    created = client.blocks("d")[0].created_at
    live = round_robin(client)
    live.tick(created + 0.5 * LIFETIME)  # 0.5 unlocked, all of it set aside for the first
    assert client.runs.recorded_reservations()[(first.id, client.blocks("d")[0].id)] == pytest.approx([0.5, 0.0])
    late = client.submit(pipeline(["b0"], 0.6))
    reasons = client.reasons("d")
    assert {i: client.reasons("d", pipeline_id=i)[i] for i in (first.id, late.id)} == reasons  # each alone, as among all
    why = reasons[first.id]
    assert (why.unlocked, why.demand, why.shares) == (pytest.approx(0.0), pytest.approx(0.2), 1)  # 0.1 more for each
    assert why.fits_at == pytest.approx(created + 0.7 * LIFETIME, abs=1.0)
    assert (reasons[late.id].unlock, reasons[late.id].unlock_block) == ("time", None)  # 0.4 is left when the first is granted
    live.tick(why.fits_at - 0.01 * LIFETIME)
    assert not granted(client, first.id)
    live.tick(why.fits_at)
    assert granted(client, first.id) and not granted(client, late.id)
    assert client.audit().ok


def test_round_robin_under_a_per_arrival_rule_says_why_it_gives_no_estimate(tmp_path):
    client = database(tmp_path / "p.db", serving=("rr-n", {"n": 10}))
    run = client.submit(pipeline(["b0"], 0.45))
    why = client.reasons("d")[run.id]
    assert (why.code, why.unlock, why.no_estimate, why.arrivals) == ("budget", "arrivals", ARRIVALS_SHARE, None)
    assert f"no unlock estimate: {ARRIVALS_SHARE}" in why.text() and why.short().endswith(" ?")
    assert "needs 0.45, unreserved 0 (short 0.45)" in why.text()  # alone on its block: nobody else's share


def test_a_restarted_scheduler_drops_the_reservations_it_no_longer_holds(tmp_path):
    client = database(tmp_path / "p.db", serving=("rr-t", {"lifetime": LIFETIME}))
    client.submit(pipeline(["b0"], 0.6))
    created = client.blocks("d")[0].created_at
    round_robin(client).tick(created + 0.5 * LIFETIME)
    assert client.runs.recorded_reservations()
    round_robin(client)  # recovers from the ledger alone
    assert client.runs.recorded_reservations() == {}
