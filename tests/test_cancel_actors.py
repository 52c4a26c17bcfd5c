"""Cancelling a running pipeline is recorded in the name of whoever asked: the request (a
``stop`` event), and the failure that settles the stopped job with its budget moves, locally
(the operator) and through a real server on the loopback (the authenticated user)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from privsched import connect
from privsched.client import Client
from privsched.ledger import Ledger, LedgerError
from privsched.ledger.models import OPERATOR, SCHEDULER
from privsched.remote import RemoteError
from tests.server_fixtures import Server, server, spec  # noqa: F401 -- the fixture
from tests.support.blockdata import block_files
from tests.support.serving import Serving, wait_for_state


def hanging(name: str, block: str, dataset: str = "reviews") -> dict:
    return {**spec(name, dataset, [block], epsilon=0.2), "job": {"function": "tests.service_jobs:hangs"}}


def actors(db: Path, pipeline_id: int) -> list[tuple[str, str | None, str | None, str | None]]:
    """(kind, state or bucket it leaves, … enters, actor) of each of the pipeline's events."""
    with Ledger(db) as ledger:
        return [(e.kind, e.source, e.target, e.actor) for e in ledger.events(pipeline_id=pipeline_id)]


def cancelled_by(who: str) -> list[tuple[str, str | None, str | None, str | None]]:
    """The events of a cancelled running pipeline after its start: the request, and the
    failure that consumes its allocation (the job may have read its block)."""
    return [("stop", "running", "running", who), ("fail", "allocated", "consumed", who), ("fail", "running", "failed", who)]


def status_rows(shown) -> dict[str, str]:
    assert shown.returncode == 0, shown.stderr
    return {line.split("│")[1].strip(): line.split("│")[2].strip() for line in shown.stdout.splitlines() if line.startswith("│")}


def wait_until_ended(client, pipeline_id: int) -> None:
    while not client.status(pipeline_id).state.is_final():
        time.sleep(0.05)


@pytest.fixture
def client(tmp_db: Path) -> Client:
    client = connect(tmp_db)
    client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
    client.add_blocks("reviews", block_files(tmp_db.parent, ["b0"]), unlocked=1.0)
    yield client
    client.close()


def test_a_local_cancel_of_a_running_job_records_the_operator_and_status_shows_it(client: Client, run_cli):
    with Serving(client.path):
        run = client.submit(hanging("hang", "b0"))
        wait_for_state(run, "running")
        shown = run_cli("cancel", run.id, env={"PRIVSCHED_DB": str(client.path)})
        assert (shown.returncode, shown.stdout) == (0, f"pipeline {run.id} cancelling\n"), shown.stderr
        run.wait()
    events = actors(client.path, run.id)
    assert events[:4] == [
        ("submit", None, "pending", OPERATOR),
        ("grant", "unlocked", "allocated", SCHEDULER),
        ("grant", "pending", "granted", SCHEDULER),
        ("run", "granted", "running", SCHEDULER),
    ]
    assert events[4:] == cancelled_by(OPERATOR)
    rows = status_rows(run_cli("status", run.id, env={"PRIVSCHED_DB": str(client.path)}))
    assert rows["finished"].endswith(f"by {OPERATOR}") and rows["cancel requested"].endswith(f"by {OPERATOR}")
    assert client.audit().ok


def test_the_python_api_cancels_in_the_name_it_is_given(client: Client):
    with Serving(client.path):
        run = client.submit(hanging("hang", "b0"))
        wait_for_state(run, "running")
        assert client.cancel(run.id, actor="carol") == "cancelling"
        run.wait()
    assert actors(client.path, run.id)[4:] == cancelled_by("carol")
    assert run.message == "cancelled by its user while running"


def test_cancels_through_the_server_record_the_user_who_asked(server: Server, run_cli):
    alice = connect(server.url, token=server.tokens["alice"])
    with Serving(server.db):
        first, second = (alice.submit(hanging(name, block)) for name, block in (("first", "b0"), ("second", "b1")))
        for run in (first, second):
            wait_for_state(run, "running")
        assert server.call("POST", f"/v1/pipelines/{first.id}/cancel", user="bob")[0] == 403  # not bob's
        assert [e[0] for e in actors(server.db, first.id)] == ["submit", "grant", "grant", "run"]
        assert server.call("POST", f"/v1/pipelines/{first.id}/cancel", user="admin") == (200, {"id": first.id, "outcome": "cancelling"})
        assert alice.cancel(second.id) == "cancelling"  # the remote client
        for run in (first, second):
            wait_until_ended(alice, run.id)
    assert actors(server.db, first.id)[0][3] == "alice" and actors(server.db, first.id)[4:] == cancelled_by("admin")
    assert actors(server.db, second.id)[4:] == cancelled_by("alice")
    remote = {"PRIVSCHED_SERVER": server.url, "PRIVSCHED_TOKEN": server.tokens["vera"]}
    for pipeline, who in ((first.id, "admin"), (second.id, "alice")):
        rows = status_rows(run_cli("status", pipeline, env=remote))
        assert rows["submitted"].endswith("by alice")
        assert rows["cancel requested"].endswith(f"by {who}") and rows["finished"].endswith(f"by {who}")
    with pytest.raises(RemoteError, match="already ended"):
        alice.cancel(second.id)


def test_a_stop_request_for_a_pipeline_not_running_is_refused_and_records_nothing(client: Client):
    run = client.submit(hanging("hang", "b0"))
    before = actors(client.path, run.id)
    with pytest.raises(LedgerError, match=f"cannot cancel pipeline {run.id}: it is pending"):
        client.ledger.request_stop(run.id, actor="carol")
    assert actors(client.path, run.id) == before


def test_a_running_job_cancelled_before_it_reached_its_data_has_its_allocation_released(client: Client):
    from tests.conftest import REPO

    waiting = {**spec("wait", "reviews", ["b0"], epsilon=0.2), "job": {"function": "tests.sandbox_jobs:waits", "pythonpath": [str(REPO)]}}
    with Serving(client.path):
        run = client.submit(waiting)
        started = client.runs.workdir(run.id) / "started"
        deadline = time.monotonic() + 120
        while not started.exists():
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        client.cancel(run.id)
        run.wait()
    assert actors(client.path, run.id)[4:] == [
        ("stop", "running", "running", OPERATOR),
        ("fail", "allocated", "unlocked", OPERATOR),
        ("fail", "running", "failed", OPERATOR),
    ]
    assert float(client.ledger.get_block("reviews", "b0").consumed[0]) == 0.0 and client.audit().ok
