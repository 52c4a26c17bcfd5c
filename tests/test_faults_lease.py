"""Split brain: a scheduler paused past its lease (SIGSTOP on a real process) while a second
one takes over. The first cannot write once it resumes; the second adopts its jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched import connect
from privsched.client import Client
from privsched.ledger import BlockSpec, Ledger
from privsched.ledger.lease import LeaseLost
from privsched.policies import make_policy
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Pool
from privsched.service.serve import ServiceError, serve
from tests.support.blockdata import block_file
from tests.support.faults import EPSILON, HELPER, job_runs, submit


@pytest.fixture
def client(tmp_db: Path) -> Client:
    client = connect(tmp_db)
    client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
    client.ledger.add_blocks("reviews", [BlockSpec("b0", block_file(tmp_db.parent, "b0"))], unlocked_fraction=1.0)
    yield client
    client.close()


def test_a_write_of_a_superseded_lease_holder_is_refused_and_changes_nothing(client, dump_db):
    client.submit(
        {"name": "p", "dataset": "reviews", "blocks": ["b0"], "epsilon": 0.5, "job": {"function": "tests.service_jobs:spend_half"}}
    )
    first, second = Ledger(client.path), Ledger(client.path)
    assert first.acquire_lease("first", ttl=1.0, now=100.0)
    assert second.acquire_lease("second", ttl=30.0, now=102.0)  # the first one's lease expired
    before = dump_db(client.path)
    with pytest.raises(LeaseLost, match="generation 1"):
        first.grant([1], now=103.0)
    assert dump_db(client.path) == before
    assert second.grant([1], now=103.0) == [1]
    first.close()
    second.close()


def test_generations_only_grow_across_releases(client):
    ledger = Ledger(client.path)
    generations = []
    for holder in ("a", "b", "a"):
        assert ledger.acquire_lease(holder, ttl=30.0)
        generations.append(ledger.lease_holder()["generation"])
        ledger.release_lease(holder)
    assert generations == [1, 2, 3]
    ledger.close()


def _take_over(db: Path, logs: list[str], errors: list[BaseException]) -> threading.Thread:
    """A second scheduler, serving until idle once the paused one's lease expired."""

    def run() -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                serve(db, make_policy("fcfs"), LocalExecutor(), Pool((), cpus=4.0, memory=0), tick=0.05, until_idle=True, log=logs.append)
                return
            except ServiceError as exc:  # the first one's lease has not expired yet
                if "already serving" not in str(exc) or time.monotonic() > deadline:
                    errors.append(exc)
                    return
                time.sleep(0.1)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("step", ["before-running", "after-marker"])
def test_a_scheduler_paused_past_its_lease_cannot_write_when_it_resumes(client: Client, step: str):
    """Paused before it marks the job running, the successor runs the job; paused while it
    holds the launch (the process not spawned yet), the successor waits for the launch lock,
    then adopts the job the first one spawns on resuming, just before its write is refused."""
    pipeline_id = submit(client, seconds=0.5)
    first = subprocess.Popen(
        [sys.executable, str(HELPER), str(client.path), step, "stop", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "fault"
        logs: list[str] = []
        errors: list[BaseException] = []
        second = _take_over(client.path, logs, errors)
        while client.ledger.lease_holder() is None or client.ledger.lease_holder()["pid"] != os.getpid():
            time.sleep(0.05)
        time.sleep(0.3)  # the second one serves while the first is still paused
        if step == "after-marker":
            assert client.ledger.get_pipeline(pipeline_id).state == "running" and job_runs(client, pipeline_id) == 0
        os.kill(first.pid, signal.SIGCONT)
        _, stderr = first.communicate(timeout=60)
        second.join(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 3 and "lost the scheduler lease" in stderr, stderr
    assert not errors and not second.is_alive()
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "completed", (info.message, logs)
    assert job_runs(client, pipeline_id) == 1
    assert client.ledger.get_block("reviews", "b0").consumed[0] == pytest.approx(EPSILON)  # a user job: its grant
    assert client.ledger.list_pipelines(states=["granted", "running"]) == []
    assert client.ledger.audit().ok


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from(["acquire", "renew", "release", "write"]), st.floats(0.0, 20.0)), max_size=25
    )
)
def test_a_write_succeeds_exactly_while_its_writer_holds_the_lease_generation_it_took(tmp_path_factory, steps):
    """Any interleaving of three schedulers taking, renewing, releasing the lease and writing:
    a fenced write goes through if and only if the lease still names its writer at the
    generation that writer took; generations only grow."""
    path = tmp_path_factory.mktemp("lease") / "p.db"
    Ledger.init(path).close()
    ledgers = {h: Ledger(path) for h in "abc"}
    lease: dict | None = None  # the model: holder, expiry, generation
    fences: dict[str, int] = {}
    now = 1000.0
    try:
        for holder, op, advance in steps:
            now += advance
            ledger = ledgers[holder]
            if op == "acquire":
                free = lease is None or lease["holder"] == holder or lease["expires"] <= now
                assert ledger.acquire_lease(holder, ttl=10.0, now=now) == free
                if free:
                    lease = {"holder": holder, "expires": now + 10.0, "generation": (lease or {}).get("generation", 0) + 1}
                    fences[holder] = lease["generation"]
            elif op == "renew":
                ours = lease is not None and lease["holder"] == holder
                assert ledger.renew_lease(holder, ttl=10.0, now=now) == ours
                if ours:
                    lease["expires"] = now + 10.0
            elif op == "release":
                ledger.release_lease(holder)
                if lease is not None and lease["holder"] == holder:
                    lease["expires"] = 0.0
                fences.pop(holder, None)
            else:
                allowed = holder not in fences or (lease["holder"], lease["generation"]) == (holder, fences[holder])
                if allowed:
                    ledger.expire(now=now)
                else:
                    with pytest.raises(LeaseLost):
                        ledger.expire(now=now)
    finally:
        for ledger in ledgers.values():
            ledger.close()
