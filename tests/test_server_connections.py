"""The pool of ledger connections the API's request threads read through."""

from __future__ import annotations

from privsched import connect
from privsched.server.connections import ConnectionPool


def test_requests_at_once_read_through_distinct_connections_that_are_reused_after(tmp_path):
    with connect(tmp_path / "a.db") as client:
        client.init()
    pool = ConnectionPool(tmp_path / "a.db")
    with pool.reads() as first, pool.reads() as second:
        assert first.client.ledger.db is not second.client.ledger.db
        assert first.identities.db is not second.identities.db
    with pool.reads() as again:
        assert again in (first, second)
    pool.close()
