"""A remote client keeps one connection open between calls; the server closes it once it
has been idle a while (uvicorn's keep-alive timeout). The next call, even one that is not
safe to repeat, goes out on a new connection instead of failing on the closed one."""

from __future__ import annotations

import select

import privsched as ps
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture
from tests.support.waiting import wait_for


def test_a_call_after_the_server_closed_the_idle_connection_goes_out_on_a_new_one(server: Server):
    alice = ps.connect(server.url, token=server.tokens["alice"])
    run = alice.submit(spec())
    kept = alice._conn.sock  # the keep-alive connection the submission went out on
    wait_for(lambda: select.select([kept], [], [], 0)[0], "the server closed the idle connection")
    assert alice.cancel(run.id) == "cancelled"  # a POST without an id: sent once, never repeated
    assert run.status == "cancelled"
