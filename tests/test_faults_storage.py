"""A full database does not stop the scheduler: it keeps watching its jobs, reports the
condition, retries, and settles every job correctly once space returns.

The database is made full with SQLite's own size limit, ``PRAGMA max_page_count``, on the
scheduler's connection (SQLite then answers SQLITE_FULL, "database or disk is full",
exactly as on a full disk), after filling the free space of its last pages."""

from __future__ import annotations

import threading
import time

import pytest

from privsched.client import Client
from privsched.ledger import Ledger
from privsched.ledger.errors import StorageFull
from privsched.policies import make_policy
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service.serve import CONDITION_FILE, serve
from tests.support.faults import EPSILON, job_runs, client  # noqa: F401 -- client: a fixture


def fill(ledger: Ledger) -> None:
    """Cap the database at its current size, then use up the free space of its pages with
    large writes (datasets), then small ones (one event row each)."""
    ledger.create_dataset("filler", epsilon=1.0, delta=1e-6, accounting="basic")
    (block,) = ledger.add_blocks("filler", ["f0"])
    pages = ledger.db.execute("PRAGMA page_count").fetchone()[0]
    ledger.db.execute(f"PRAGMA max_page_count = {pages}")
    for write in (lambda i: ledger.create_dataset(f"filler-{i}", epsilon=1.0, delta=1e-6, accounting="basic"),
                  lambda i: ledger.unlock({block.id: 1e-6})):
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


def test_a_job_that_ends_while_the_database_is_full_is_settled_once_space_returns(client: Client):
    job = {"function": "tests.fault_jobs:counted_wait_then_spend"}
    pipeline_id = client.submit({"name": "p", "dataset": "reviews", "blocks": ["b0"], "epsilon": EPSILON,
                                 "job": job}).id
    ledger = Ledger(client.path)
    logs: list[str] = []
    stop = threading.Event()
    policy = make_policy("dpf-n", n=1)  # unlocks a block on demand only: the filler's stays locked
    thread = threading.Thread(target=serve, args=(client.path, policy, LocalExecutor(),
                                                  Pool((), cpus=4.0, memory=0)),
                              kwargs={"tick": 0.05, "stop": stop, "log": logs.append, "ledger": ledger})
    thread.start()
    try:
        wait_for(lambda: client.ledger.get_pipeline(pipeline_id).state == "running", "the job to start")
        runs = RunDirs(client.path)
        wait_for((runs.workdir(pipeline_id) / "runs.txt").exists, "the job's code to run")
        fill(ledger)
        (runs.workdir(pipeline_id) / "go").touch()  # the job ends now; its settling is refused
        condition = runs.root / CONDITION_FILE
        wait_for(condition.exists, "the condition to be reported")
        assert "database or disk is full" in condition.read_text()
        time.sleep(1.0)
        assert thread.is_alive()
        assert client.ledger.get_pipeline(pipeline_id).state == "running"
        ledger.db.execute("PRAGMA max_page_count = 1073741823")
        wait_for(lambda: client.ledger.get_pipeline(pipeline_id).state == "completed", "the job to be settled")
        wait_for(lambda: not condition.exists(), "the condition to clear")
    finally:
        stop.set()
        thread.join(timeout=60)
        ledger.close()
    assert any("storage full since" in line for line in logs)
    assert any("storage available again" in line for line in logs)
    assert job_runs(client, pipeline_id) == 1
    assert client.ledger.get_block("reviews", "b0").consumed[0] == pytest.approx(EPSILON)  # a user job: its grant
    assert client.ledger.audit().ok
