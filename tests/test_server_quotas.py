"""Team quotas through the API: the grant transaction keeps a team within its share of
each block, a team at its quota waits with the quota as its reason, and is granted once
its quota allows."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import privsched as ps
from privsched.ledger import Ledger
from privsched.remote import RemoteError
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture


def held(db, team_users: set[str], key: str) -> float:
    with Ledger(db) as ledger:
        return sum(
            float(p.demands[key][0]) for p in ledger.list_pipelines(states=["granted"]) if p.owner in team_users and key in p.demands
        )


def test_a_team_at_its_quota_waits_for_it_and_is_granted_when_it_allows(server: Server, run_cli):
    admin = ps.connect(server.url, token=server.tokens["admin"])
    assert admin.set_quota("reviews", "blue", 0.5) == {"blue": 0.5}
    alice = ps.connect(server.url, token=server.tokens["alice"])
    bob = ps.connect(server.url, token=server.tokens["bob"])
    rita = ps.connect(server.url, token=server.tokens["rita"])
    first, second, other = (
        alice.submit(spec(blocks=["b0"], epsilon=0.4)),
        bob.submit(spec(blocks=["b0"], epsilon=0.3)),
        rita.submit(spec(blocks=["b0"], epsilon=0.3)),
    )
    with Ledger(server.db) as ledger:
        assert ledger.grant([first.id, second.id, other.id]) == [first.id, other.id]  # blue would hold 0.7 > 0.5
    why = alice.reasons("reviews")[second.id]
    assert (why.code, why.team, why.block) == ("quota", "blue", "b0")
    listed = run_cli("list", env={"PRIVSCHED_SERVER": server.url, "PRIVSCHED_TOKEN": server.tokens["bob"], "COLUMNS": "200"}).stdout
    assert "quota blue b0" in listed
    with pytest.raises(RemoteError) as refused:
        bob.set_quota("reviews", "blue", 1.0)
    assert refused.value.status == 403
    admin.set_quota("reviews", "blue", 0.7)
    with Ledger(server.db) as ledger:
        assert ledger.grant([second.id]) == [second.id]
        assert ledger.audit().ok


def test_concurrent_grants_never_take_a_team_past_its_quota(server: Server):
    ps.connect(server.url, token=server.tokens["admin"]).set_quota("reviews", "blue", 0.35)
    for user in ("alice", "bob"):
        client = ps.connect(server.url, token=server.tokens[user])
        for _ in range(6):
            client.submit(spec(blocks=["b1"], epsilon=0.1))

    def grant() -> None:
        with Ledger(server.db) as ledger:
            for p in ledger.list_pipelines(states=["pending"]):
                ledger.grant([p.id])

    threads = [threading.Thread(target=grant) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert np.isclose(held(server.db, {"alice", "bob"}, "b1"), 0.3)  # three grants of 0.1 fit 0.35, a fourth not
