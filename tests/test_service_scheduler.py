"""The scheduling loop on a real ledger and real job processes: unlocking, admission,
placement, settling of every way a job can end, cancellation, restarts and the lease."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from privsched import connect
from privsched.client import Client
from privsched.ledger import LedgerError
from privsched.policies import make_policy
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service.scheduler import Scheduler
from privsched.service.serve import ServiceError, serve_options
from tests.support.blockdata import block_files
from tests.support.serving import Serving, wait_for_state
from tests.support.waiting import PATIENCE, wait_for

POOL = Pool((), cpus=8.0, memory=0)


@pytest.fixture
def client(tmp_db: Path) -> Client:
    """A basic-accounting dataset of blocks b0..b5, each with ε_G = 1, δ_G = 1e-6."""
    client = connect(tmp_db)
    client.create_dataset("reviews", epsilon=1.0, delta=1e-6, accounting="basic")
    client.add_blocks("reviews", block_files(tmp_db.parent, [f"b{i}" for i in range(6)]))
    client.runs.record_pool(Pool(("0", "1"), cpus=8.0, memory=0))
    yield client
    client.close()


def pipeline(name: str, function: str, blocks: list[str], epsilon: float = 0.3, **extra) -> dict:
    return {
        "name": name,
        "dataset": "reviews",
        "blocks": blocks,
        "epsilon": epsilon,
        "job": {"function": f"tests.service_jobs:{function}", "params": extra.pop("params", {})},
        **extra,
    }


def scheduler(client: Client, policy: str = "fcfs", pool: Pool = POOL, **params) -> Scheduler:
    spec = make_policy(policy, **params)
    sched = Scheduler(client.ledger, spec, LocalExecutor(), pool, RunDirs(client.path))
    sched.recover(time.time())
    return sched


def locked(client: Client, key: str) -> float:
    return float(client.ledger.get_block("reviews", key).locked[0])


def consumed(client: Client, key: str) -> float:
    return float(client.ledger.get_block("reviews", key).consumed[0])


def run_until_idle(client: Client, policy: str = "fcfs", **options):
    return client.run_until_idle(policy, tick=0.1, cpus=8, gpus=options.pop("gpus", 2), **options)


def test_per_arrival_unlocking_survives_a_restart_without_unlocking_twice(client: Client):
    for i in range(2):
        client.submit(pipeline(f"p{i}", "spend_half", ["b0"], epsilon=0.6))
    scheduler(client, "dpf-n", n=4).tick(time.time())
    assert locked(client, "b0") == pytest.approx(0.5)  # two arrivals of four
    scheduler(client, "dpf-n", n=4).tick(time.time())  # a restarted scheduler
    assert locked(client, "b0") == pytest.approx(0.5)
    client.submit(pipeline("p2", "spend_half", ["b0"], epsilon=0.6))
    scheduler(client, "dpf-n", n=4).tick(time.time())
    assert locked(client, "b0") == pytest.approx(0.25)
    assert locked(client, "b1") == pytest.approx(1.0)  # nobody asked for b1


def test_per_time_unlocking_follows_block_age_across_restarts(client: Client):
    created = client.ledger.get_block("reviews", "b0").created_at
    first = scheduler(client, "dpf-t", lifetime=100.0)
    report = first.tick(created + 25)
    assert locked(client, "b0") == pytest.approx(0.75) and report.more_to_unlock
    scheduler(client, "dpf-t", lifetime=100.0).tick(created + 25)
    assert locked(client, "b0") == pytest.approx(0.75)
    first.tick(created + 60)
    assert locked(client, "b0") == pytest.approx(0.4)
    report = first.tick(created + 1000)
    assert locked(client, "b0") == pytest.approx(0.0) and not report.more_to_unlock


def test_every_way_a_job_ends_is_settled_and_the_scheduler_keeps_going(client: Client):
    jobs = {
        "b0": "spend_half",
        "b1": "no_report",
        "b2": "raises_after_reading",
        "b3": "raises_before_reading",
        "b4": "hangs",
        "b5": "exits_without_result",
    }
    limits = {"b4": {"max_runtime": 3}}  # only the hanging job: others may start slowly on a busy machine
    runs = {key: client.submit(pipeline(f, f, [key], epsilon=0.4, **limits.get(key, {}))) for key, f in jobs.items()}
    run_until_idle(client)
    states = {key: run.status for key, run in runs.items()}
    assert states == {"b0": "completed", "b1": "completed", "b2": "failed", "b3": "failed", "b4": "failed", "b5": "failed"}
    spent = {key: consumed(client, key) for key in jobs}
    # user jobs: their grant, whatever they say, unless they failed before reaching their data
    assert spent == pytest.approx({key: 0.0 if key == "b3" else 0.4 for key in jobs})
    assert "max_runtime" in runs["b4"].message and "without writing its result" in runs["b5"].message
    assert client.audit().ok


def test_granted_jobs_wait_for_compute_in_grant_order_with_backfilling(client: Client):
    first = client.submit(pipeline("gpu-a", "sleep_then_spend", ["b0"], resources={"gpus": 1}, params={"seconds": 1}))
    second = client.submit(pipeline("gpu-b", "spend_half", ["b1"], resources={"gpus": 1}))
    small = client.submit(pipeline("cpu", "spend_half", ["b2"]))
    one_gpu = Pool(("0",), cpus=8.0, memory=0)
    report = scheduler(client, pool=one_gpu).tick(time.time())
    assert report.started == [first.id, small.id] and report.waiting == 1
    run_until_idle(client, gpus=1)
    assert second.info.started_at >= first.info.finished_at
    assert {first.status, second.status, small.status} == {"completed"}


def test_a_job_too_large_for_this_schedulers_pool_fails_with_its_budget_released(client: Client):
    run = client.submit(pipeline("big", "spend_half", ["b0"], resources={"gpus": 2}))
    run_until_idle(client, gpus=1)
    assert run.status == "failed" and "the job asks for 2 GPU(s) but the pool has 1" in run.message
    assert consumed(client, "b0") == 0.0 and client.audit().ok


def test_until_idle_stops_once_the_rest_can_never_fit_and_has_ended(client: Client):
    first = client.submit(pipeline("first", "no_report", ["b0"], epsilon=0.7))
    second = client.submit(pipeline("second", "no_report", ["b0"], epsilon=0.7))
    summary = run_until_idle(client)
    assert (first.status, second.status, summary.pending) == ("completed", "failed", 0)
    assert client.ledger.get_pipeline(second.id).message.startswith("can never be granted")


def test_round_robin_reservations_grant_both_fair_shares(client: Client):
    runs = [client.submit(pipeline(f"rr{i}", "spend_half", ["b0"], epsilon=0.45)) for i in range(2)]
    run_until_idle(client, "rr-n", n=2)
    assert [r.status for r in runs] == ["completed", "completed"]
    assert client.audit().ok


def test_cancelling_a_running_job_stops_it_and_consumes_its_allocation(client: Client):
    with Serving(client.path):
        run = client.submit(pipeline("hang", "hangs", ["b0"], epsilon=0.5))
        wait_for_state(run, "running")
        assert client.cancel(run.id) == "cancelling"
        run.wait(timeout=PATIENCE)
    assert run.status == "failed" and run.message == "cancelled by its user while running"
    assert consumed(client, "b0") == pytest.approx(0.5)


def test_cancelling_a_pending_pipeline_and_refusing_finished_or_unknown_ones(client: Client):
    run = client.submit(pipeline("p", "spend_half", ["b0"]))
    assert client.cancel(run.id) == "cancelled"
    with pytest.raises(LedgerError, match="already ended"):
        client.cancel(run.id)
    with pytest.raises(LedgerError):
        client.cancel(999)


def test_a_submission_is_scheduled_without_waiting_for_the_tick(client: Client):
    with Serving(client.path, tick=3600.0):  # its next tick is an hour away: no test waits that long
        client.submit(pipeline("first", "spend_half", ["b0"])).wait(timeout=PATIENCE)
        run = client.submit(pipeline("quick", "spend_half", ["b0"]))  # the scheduler is asleep: the submission wakes it
        run.wait(timeout=PATIENCE)
    assert run.status == "completed"


def test_a_second_scheduler_on_the_same_database_is_refused(client: Client):
    with Serving(client.path) as first:
        wait_for(lambda: client.ledger.lease_holder() is not None, "the first scheduler holds the lease")
        with pytest.raises(ServiceError, match="another scheduler is already serving"):
            serve_options(client.path, tick=0.1)
    assert first.error is None


def test_after_a_crash_running_jobs_are_settled_from_what_they_left(client: Client):
    slow = client.submit(pipeline("slow", "sleep_then_spend", ["b0"], params={"seconds": 2}))
    done = client.submit(pipeline("done", "spend_half", ["b1"]))
    lost = client.submit(pipeline("lost", "exits_without_result", ["b2"]))
    crashed = scheduler(client)
    crashed.tick(time.time())  # starts all three, then "crashes": nobody collects
    assert {slow.status, done.status, lost.status} == {"running"}
    wait_for(RunDirs(client.path).result(done.id).exists, f"pipeline {done.id} has written its result")
    run_until_idle(client)
    assert (slow.status, done.status, lost.status) == ("completed", "completed", "failed")
    assert consumed(client, "b0") == pytest.approx(0.3) and consumed(client, "b2") == pytest.approx(0.3)
    grants = [e for e in client.ledger.events() if e.kind == "grant" and e.target == "granted"]
    assert sorted(e.pipeline_id for e in grants) == [slow.id, done.id, lost.id]  # one block each, granted once
    assert client.audit().ok
    crashed.executor.poll(time.time())  # reap the children of the "crashed" scheduler


def test_round_robin_keeps_water_filled_budget_between_passes(client: Client):
    first, second = (client.submit(pipeline(f"rr{i}", "spend_half", ["b0"], epsilon=0.3)) for i in range(2))
    sched = scheduler(client, "rr-n", n=4)
    assert sched.tick(time.time()).granted == []  # 0.5 unlocked, 0.25 set aside for each
    client.submit(pipeline("rr2", "spend_half", ["b0"], epsilon=0.3))
    report = sched.tick(time.time())  # 0.25 more: 0.05 tops up each of the first two
    assert report.granted == [first.id, second.id]
    run_until_idle(client, "rr-n", n=4)
    assert client.audit().ok
