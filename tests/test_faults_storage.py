"""A full database does not stop the scheduler: it keeps watching its jobs, reports the
condition, retries, and settles every job correctly once space returns.

The database is made full with SQLite's own size limit, ``PRAGMA max_page_count``, on the
scheduler's connection (SQLite then answers SQLITE_FULL, "database or disk is full",
exactly as on a full disk), after filling the free space of its last pages."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from privsched.client import Client
from privsched.ledger import Ledger
from privsched.ledger.errors import StorageFull
from privsched.policies import make_policy
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.remote import RemoteClient
from privsched.server.runner import Listen, http_api
from privsched.service.serve import Condition, serve
from privsched.cli.remote_option import TOKEN_ENV
from privsched.ledger.identities import Identities
from tests.cli_inprocess import invoke
from tests.support.faults import EPSILON, job_runs, client  # noqa: F401 -- client: a fixture


def fill(ledger: Ledger) -> None:
    """Cap the database at its current size, then use up the free space of its pages with
    large writes (datasets), then small ones (one event row each)."""
    ledger.create_dataset("filler", epsilon=1.0, delta=1e-6, accounting="basic")
    (block,) = ledger.add_blocks("filler", ["f0"])
    pages = ledger.db.execute("PRAGMA page_count").fetchone()[0]
    ledger.db.execute(f"PRAGMA max_page_count = {pages}")
    for write in (
        lambda i: ledger.create_dataset(f"filler-{i}", epsilon=1.0, delta=1e-6, accounting="basic"),
        lambda i: ledger.unlock({block.id: 1e-6}),
    ):
        for i in range(10_000):
            try:
                write(i)
            except StorageFull:
                break


def wait_for(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@dataclass
class Full:
    pipeline_id: int
    ledger: Ledger  # the scheduler's connection, capped
    thread: threading.Thread
    logs: list[str]


@contextmanager
def full_while_a_job_ends(client: Client) -> Iterator[Full]:
    """A scheduler serving in a thread, whose database is made full while a job runs; the
    job then ends, so settling it is refused. Yields once the condition is reported; lift
    the cap with :func:`make_room`."""
    job = {"function": "tests.fault_jobs:counted_wait_then_spend"}
    pipeline_id = client.submit({"name": "p", "dataset": "reviews", "blocks": ["b0"], "epsilon": EPSILON, "job": job}).id
    ledger = Ledger(client.path)
    logs: list[str] = []
    stop = threading.Event()
    policy = make_policy("dpf-n", n=1)  # unlocks a block on demand only: the filler's stays locked
    thread = threading.Thread(
        target=serve,
        args=(client.path, policy, LocalExecutor(), Pool((), cpus=4.0, memory=0)),
        kwargs={"tick": 0.05, "stop": stop, "log": logs.append, "ledger": ledger},
    )
    thread.start()
    try:
        wait_for(lambda: client.ledger.get_pipeline(pipeline_id).state == "running", "the job to start")
        runs = RunDirs(client.path)
        wait_for((runs.workdir(pipeline_id) / "runs.txt").exists, "the job's code to run")
        fill(ledger)
        (runs.workdir(pipeline_id) / "go").touch()  # the job ends now; its settling is refused
        wait_for(runs.condition().exists, "the condition to be reported")
        yield Full(pipeline_id, ledger, thread, logs)
    finally:
        stop.set()
        thread.join(timeout=60)
        ledger.close()


def make_room(full: Full) -> None:
    full.ledger.db.execute("PRAGMA max_page_count = 1073741823")


def test_a_job_that_ends_while_the_database_is_full_is_settled_once_space_returns(client: Client):
    condition = RunDirs(client.path).condition()
    with full_while_a_job_ends(client) as full:
        assert "database or disk is full" in condition.read_text()
        time.sleep(1.0)
        assert full.thread.is_alive()
        assert client.ledger.get_pipeline(full.pipeline_id).state == "running"
        make_room(full)
        wait_for(lambda: client.ledger.get_pipeline(full.pipeline_id).state == "completed", "the job to be settled")
        wait_for(lambda: not condition.exists(), "the condition to clear")
    assert any("storage full since" in line for line in full.logs)
    assert any("storage available again" in line for line in full.logs)
    assert job_runs(client, full.pipeline_id) == 1
    assert client.ledger.get_block("reviews", "b0").consumed[0] == pytest.approx(EPSILON)  # a user job: its grant
    assert client.ledger.audit().ok


def unwrapped(table: str) -> str:
    """The words of a printed table, without its borders or line breaks."""
    return " ".join(table.replace("│", " ").split())


def reported(client: Client, server: RemoteClient, url: str, token: str, pipeline_id: int) -> list[str | None]:
    """The condition as the client, the remote client, the API's scheduler and dashboard
    queue routes, and ``privsched status`` (local and through the server) report it."""
    shown = []
    for args in ((), ("--server", url)):
        outcome = invoke(*args, "status", pipeline_id, db=None if args else client.path)
        assert outcome.code == 0, outcome.stderr
        words = unwrapped(outcome.stdout)
        row = re.search(r"(?<!by )scheduler", words)  # the row, not an event's actor ("… by scheduler")
        shown.append(words[row.start() :] if row else None)
    queue = server.request("GET", "/v1/dashboard/queue")
    return [client.scheduler_condition(), server.scheduler_condition(), queue["condition"], *shown]


def test_a_full_database_is_reported_by_status_the_api_and_the_dashboard_until_space_returns(
    client: Client, monkeypatch: pytest.MonkeyPatch
):
    with Identities(client.path) as identities:
        token = identities.add_user("admin", "admin")
    monkeypatch.setenv(TOKEN_ENV, token)
    with http_api(client.path, Listen("127.0.0.1", 0)) as bound, RemoteClient(bound.url, token) as server:
        with full_while_a_job_ends(client) as full:
            during = reported(client, server, bound.url, token, full.pipeline_id)
            make_room(full)
            wait_for(lambda: not RunDirs(client.path).condition().exists(), "the condition to clear")
            after = reported(client, server, bound.url, token, full.pipeline_id)
    condition, *others = during
    assert condition.startswith("storage full since ") and condition.endswith("database or disk is full")
    assert others[:2] == [condition, condition]
    for row in others[2:]:  # privsched status: the "scheduler" row and what follows it
        assert row is not None and row.startswith("scheduler storage full since ") and "retrying" in row
    assert after == [None] * 5


def test_the_condition_is_printed_as_text(client: Client):
    runs = RunDirs(client.path)
    runs.root.mkdir(parents=True)  # as the scheduler makes it when it starts
    Condition(runs, lambda message: None).full(StorageFull("[bold]x[/] \x1b[31m"))
    pipeline_id = client.submit(
        {
            "name": "p",
            "dataset": "reviews",
            "blocks": ["b0"],
            "epsilon": EPSILON,
            "job": {"function": "tests.fault_jobs:counted_wait_then_spend"},
        }
    ).id
    outcome = invoke("status", pipeline_id, db=client.path)
    assert outcome.code == 0, outcome.stderr
    assert "\x1b" not in outcome.stdout
    assert "[bold]x[/] \\x1b[31m; retrying" in unwrapped(outcome.stdout)
