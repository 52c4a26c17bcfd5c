"""A job run in tests/test_data_parallel.py, as a data-parallel job's sandbox holds it."""

from __future__ import annotations

import socket

from privsched.jobs.context import JobContext


def loopbacks(ctx: JobContext) -> None:
    """Connects to a server of its own on its loopback, then to the test's server on the
    host's loopback (``params['port']``); reports how each went."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()
    try:
        socket.create_connection(("127.0.0.1", int(ctx.params["port"])), timeout=5).close()
        host = "connected"
    except OSError as exc:
        host = type(exc).__name__
    ctx.report_metrics(own="connected", host=host)
