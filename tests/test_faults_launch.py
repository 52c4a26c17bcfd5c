"""A real scheduler process killed (SIGKILL) at each step of a launch, then a new scheduler
recovers: a job that never started costs nothing, a job that started is adopted and settled
once with what it spent, nothing stays ``running`` without a job, and the audit is clean."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from privsched.client import Client
from privsched.policies import make_policy
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service.scheduler import Scheduler
from tests.support.faults import EPSILON, HELPER, client, job_runs, submit  # noqa: F401 -- client: a fixture


def crash_at(client: Client, step: str) -> None:
    done = subprocess.run([sys.executable, str(HELPER), str(client.path), step, "kill"], capture_output=True, text=True)
    assert done.returncode == -9 and "fault" in done.stdout, done.stderr


def recover(client: Client) -> None:
    client.run_until_idle("fcfs", tick=0.05, cpus=4, gpus=0)


def assert_settled_cleanly(client: Client) -> None:
    assert client.ledger.list_pipelines(states=["granted", "running"]) == []
    assert client.ledger.audit().ok


@pytest.mark.parametrize("step", ["before-running", "after-popen", "after-pid-file", "after-started"])
def test_a_job_started_before_the_crash_or_after_recovery_runs_once_and_is_charged_what_it_spent(client: Client, step: str):
    pipeline_id = submit(client)
    crash_at(client, step)
    if step == "after-popen":  # found by the launch token in its environment
        assert not RunDirs(client.path).pid_file(pipeline_id).exists()
    recover(client)
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "completed", info.message
    assert job_runs(client, pipeline_id) == 1
    assert client.ledger.get_block("reviews", "b0").consumed[0] == pytest.approx(EPSILON)  # a user job: its grant
    assert_settled_cleanly(client)


def test_a_launch_that_never_spawned_its_process_releases_the_grant(client: Client):
    pipeline_id = submit(client)
    crash_at(client, "after-running")
    assert client.ledger.get_pipeline(pipeline_id).state == "running"
    recover(client)
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "failed" and "never started" in info.message
    assert job_runs(client, pipeline_id) == 0
    assert client.ledger.get_block("reviews", "b0").consumed[0] == 0.0
    assert_settled_cleanly(client)


def test_a_launch_cut_between_its_spawn_marker_and_its_process_is_charged_in_full(client: Client):
    """Whether the process started cannot be told apart from a job that died at once without
    a result, so the grant is consumed (docs/design.md §4.4); the window is the process spawn alone."""
    pipeline_id = submit(client)
    crash_at(client, "after-marker")
    recover(client)
    info = client.ledger.get_pipeline(pipeline_id)
    assert info.state == "failed" and "without writing its result" in info.message
    assert job_runs(client, pipeline_id) == 0
    assert client.ledger.get_block("reviews", "b0").consumed[0] == pytest.approx(EPSILON)
    assert_settled_cleanly(client)


def test_recovery_watches_the_process_the_ledger_recorded_not_a_pid_file_the_job_forged(client: Client):
    job = {"function": "tests.fault_jobs:forges_its_pid_file", "params": {"seconds": 1.5, "victim": os.getpid()}}
    pipeline_id = client.submit({"name": "forger", "dataset": "reviews", "blocks": ["b0"], "epsilon": EPSILON, "job": job}).id
    pool = Pool((), cpus=4.0, memory=0)
    first = Scheduler(client.ledger, make_policy("fcfs"), LocalExecutor(), pool, RunDirs(client.path))
    first.recover(time.time())
    assert first.tick(time.time()).started == [pipeline_id]
    record = client.ledger.launch_records([pipeline_id])[pipeline_id]
    assert record.state == "started" and record.pid is not None
    # The job itself can no longer reach the scheduler's pid file (it writes only its work
    # folder); forge the file as if it had, pointing at another live process.
    pid_file = RunDirs(client.path).pid_file(pipeline_id)
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    pid_file.write_text(f"{os.getpid()} {stat[stat.rindex(')') + 2 :].split()[19]}\n")
    second = Scheduler(client.ledger, make_policy("fcfs"), LocalExecutor(), pool, RunDirs(client.path))
    second.recover(time.time())
    deadline = time.monotonic() + 30
    while client.ledger.get_pipeline(pipeline_id).state == "running":
        assert time.monotonic() < deadline, "the real job's end was never seen"
        second.tick(time.time())
        time.sleep(0.05)
    assert client.ledger.get_pipeline(pipeline_id).state == "completed"
    assert client.ledger.get_block("reviews", "b0").consumed[0] == 0.0  # a user job that never reached its data
    assert client.ledger.audit().ok
