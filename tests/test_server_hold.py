"""The HTTP server never dies of a client: idle and slow connections are closed, connections
past the cap are refused, and a real ``privsched serve`` flooded with idle connections under a
low open-file limit keeps scheduling and serving."""

from __future__ import annotations

from collections.abc import Callable

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import privsched as ps
from privsched.remote import RemoteError
from privsched.server.limits import FD_RESERVE, MAX_CONNECTIONS, connection_cap
from privsched.server.runner import Listen, http_api
from tests.conftest import REPO
from tests.server_fixtures import make_database
from tests.test_remote_cli import free_port

#: The flood: more idle connections than the served process may open files.
FLOOD, NOFILE = 1200, 1024


def test_the_connection_cap_keeps_the_reserve_free_and_stays_within_bounds():
    assert connection_cap(1024, 40) == 1024 - 40 - FD_RESERVE
    assert connection_cap(1 << 20, 40) == MAX_CONNECTIONS
    assert connection_cap(200, 40) == 8


def test_a_connection_that_never_finishes_its_headers_is_closed(tmp_path: Path):
    db = tmp_path / "p.db"
    make_database(db)
    with http_api(db, Listen("127.0.0.1", 0), header_timeout=0.5) as bound:
        with socket.create_connection(("127.0.0.1", bound.port), timeout=60) as slow:
            slow.sendall(b"GET /v1/datasets HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            assert slow.recv(1024) == b"", "the server kept a connection that sent no complete headers"


def _lowered_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def api_line(stream) -> str:
    """The line of a starting ``serve``'s summary that gives its HTTP API (it comes once the
    scheduler owns the database)."""
    for _ in range(12):
        line = stream.readline()
        if "HTTP API" in line:
            return line
    raise AssertionError("serve never said where its HTTP API is")


@pytest.mark.slow
def test_a_scheduler_flooded_with_idle_connections_keeps_scheduling_and_serving(tmp_path: Path):
    db = tmp_path / "p.db"
    tokens = make_database(db)
    port = free_port()
    process = _serve(db, port, preexec_fn=_lowered_limit)
    flood: list[socket.socket] = []
    try:
        api_line(process.stdout)
        for _ in range(FLOOD):
            try:
                flood.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            except OSError:
                break  # the backlog is full: the flood is as large as this host lets it be
        assert len(flood) >= NOFILE, f"only {len(flood)} connections opened"
        client = ps.connect(f"http://127.0.0.1:{port}", token=tokens["alice"])
        spec = {"name": "n", "dataset": "reviews", "blocks": ["b0"], "epsilon": 0.1, "job": {"function": "tests.service_jobs:spend_half"}}
        pipeline = _submit_once_served(client, spec, process)
        local = ps.connect(db)
        deadline = time.monotonic() + 120
        while local.status(pipeline).state != "completed":
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, f"pipeline still {local.status(pipeline).state}"
            time.sleep(0.1)
        assert client.status(pipeline).state == "completed"
        assert process.poll() is None
    finally:
        for connection in flood:
            connection.close()
        process.terminate()
        process.communicate(timeout=60)


def _submit_once_served(client, spec: dict, process: subprocess.Popen) -> int:
    """Submit through the API, retrying while the flood fills every connection slot (the
    server closes idle ones after its header timeout); the pipeline's id."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return client.submit(spec, id="flooded").id
        except (RemoteError, OSError) as exc:
            assert process.poll() is None, "the scheduler died"
            assert time.monotonic() < deadline, f"never served: {exc}"
            time.sleep(0.5)


def _serve(db: Path, port: int, preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
    """``privsched serve`` (FCFS) with its API on ``port``, its output merged on ``stdout``."""
    env = {**os.environ, "PRIVSCHED_DB": str(db), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "privsched", "serve", "--policy", "fcfs", "--listen", f"127.0.0.1:{port}"]
    command += ["--tick", "100ms", "--cpus", "2", "--gpus", "0"]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=preexec_fn)


@pytest.mark.slow
def test_a_scheduler_that_takes_over_a_paused_ones_lease_binds_the_api_once_the_port_is_free(tmp_path: Path):
    db = tmp_path / "p.db"
    tokens = make_database(db)
    port = free_port()
    first = _serve(db, port)
    standby = None
    try:
        api_line(first.stdout)
        first.send_signal(signal.SIGSTOP)  # paused, holding the port and (until it expires) the lease
        deadline = time.monotonic() + 120
        while True:  # a standby retrying until the paused scheduler's lease has expired
            standby = _serve(db, port)
            holder = ps.connect(db).ledger.lease_holder
            while standby.poll() is None and (holder() or {}).get("pid") != standby.pid:
                time.sleep(0.1)
            if standby.poll() is None:
                break
            assert "already serving" in standby.stdout.read() and time.monotonic() < deadline
            time.sleep(0.5)
        first.kill()  # the port is free from now on
        first.wait(timeout=60)
        client = ps.connect(f"http://127.0.0.1:{port}", token=tokens["admin"])
        while True:
            try:
                assert [d.name for d in client.datasets()] == ["reviews", "secret"]
                break
            except RemoteError as exc:
                assert standby.poll() is None and time.monotonic() < deadline, f"the API never came back: {exc}"
                time.sleep(0.2)
        assert standby.poll() is None
    finally:
        first.kill()
        if standby is not None:
            standby.terminate()
            standby.communicate(timeout=60)
