"""The Ray executor, against a real one-machine Ray cluster with two fake GPUs.

The cluster (:func:`~privsched.service.executors.ray_local.local_cluster`) is started once
for the module and its processes are stopped at the end. Jobs are user code from
:mod:`tests.ray_jobs` and the built-in DP-SGD and statistic jobs on review blocks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from privsched import connect
from privsched.client import Client
from privsched.jobs.runner import JobResult, write_atomic
from privsched.ledger import LedgerError
from privsched.service.executors import make_executor
from privsched.service.executors.ray import RayExecutor, cluster_pool, node_refusal, submission_id
from privsched.service.executors.ray_local import free_port, local_cluster
from privsched.service.executors.ray_entry import decode_document, encode_document, parse_result, result_line
from privsched.service.resources import Placement
from privsched.service.rundirs import RunDirs
from tests.conftest import REPO
from tests.support.ray import db, ended, launch_in, running, serving, user_job, wait_until  # noqa: F401 -- db: the fixture
from tests.support.waiting import PATIENCE

GPU_JOB = "tests.ray_jobs:reports_gpus"
HANGING_JOB = "tests.ray_jobs:prints_then_hangs"


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A Ray head with 2 CPUs, 2 fake GPUs and 4 GB of task memory; its dashboard address."""
    with local_cluster(cpus=2, gpus=2, memory=4 * 10**9) as address:
        yield address


def ray_jobs(address: str, db: Path) -> list[str]:
    """Pipeline ids of the Ray jobs submitted for ``db`` (one entry per Ray job)."""
    from ray.job_submission import JobSubmissionClient

    runs = str(RunDirs(db).root)
    jobs = JobSubmissionClient(address).list_jobs()
    return sorted(j.metadata["privsched_pipeline"] for j in jobs if (j.metadata or {}).get("privsched_runs") == runs)


# -- without a cluster -------------------------------------------------------------------------


def test_the_result_line_round_trips_and_the_last_one_counts():
    first = JobResult(7, False, message="first attempt")
    last = JobResult(7, True, {"b": [0.5]}, True, "", {"loss": 0.1})
    logs = f"hello\n{result_line(first)}\nmore output\n{result_line(last)}\n"
    assert parse_result(logs, 7) == last
    assert parse_result("killed before it ended\n", 7) is None


def test_a_result_line_of_another_pipeline_or_garbled_is_a_failure():
    foreign = parse_result(result_line(JobResult(8, True, {"b": [0.0]})), 7)
    assert (foreign.pipeline_id, foreign.completed, foreign.touched_data) == (7, False, True)
    assert foreign.message == "job printed the result of another pipeline"
    garbled = parse_result(result_line(JobResult(7, True))[:-5], 7)
    assert not garbled.completed and garbled.message == "job printed a result that does not parse"


def test_the_context_travels_compressed_and_intact():
    document = '{"pipeline_id": 3, "blocks": [' + ", ".join(['{"grant": [0.25, 0.5]}'] * 500) + "]}"
    encoded = encode_document(document)
    assert decode_document(encoded) == document and len(encoded) < len(document) / 10


def test_a_job_fits_only_on_a_single_node_that_holds_all_it_asks_for():
    two_small = [{"GPU": 1.0, "CPU": 4.0, "memory": 8e9}, {"GPU": 1.0, "CPU": 4.0, "memory": 8e9}]
    assert node_refusal(Placement(("0",), 2.0, 10**9), two_small) is None
    refusal = node_refusal(Placement(("0", "1"), 2.0, 10**9), two_small)
    assert refusal is not None and refusal.startswith("no node of the Ray cluster can hold 2 GPU(s)")
    assert "largest node: 1 GPU(s), 4 CPU(s)" in refusal and "2 node(s) alive" in refusal
    assert node_refusal(Placement((), 1.0, 9 * 10**9), two_small) is not None
    assert cluster_pool(two_small).gpus == ("0", "1") and cluster_pool(two_small).cpus == 8.0


def test_submission_ids_are_stable_per_database_pipeline_and_start(tmp_path: Path):
    runs = tmp_path / "runs" / "p"
    same = submission_id(launch_in(runs, 4, 1700000000.25))
    assert same == submission_id(launch_in(runs, 4, 1700000000.25)) and same.startswith("privsched-p-4-")
    assert same != submission_id(launch_in(runs, 4, 1700000000.5))  # a new start of pipeline 4
    assert same != submission_id(launch_in(tmp_path / "elsewhere" / "runs" / "p", 4, 1700000000.25))


def test_a_ray_address_is_refused_for_the_local_executor():
    with pytest.raises(ValueError, match="applies to the ray executor only"):
        make_executor("local", "http://127.0.0.1:8265")


def test_an_unreachable_cluster_is_a_one_line_error(tmp_db: Path):
    with connect(tmp_db) as client, pytest.raises(ValueError, match="cannot reach a Ray cluster at http://127.0.0.1"):
        client.serve(executor="ray", ray_address=f"http://127.0.0.1:{free_port()}", until_idle=True)


# -- on the cluster ----------------------------------------------------------------------------


def test_dpf_granted_jobs_run_on_exactly_their_gpus_and_the_ledger_stays_consistent(ray_address: str, db: Path):
    with serving(db, ray_address, "dpf-n", n=4) as check, connect(db) as client:
        runs = client.submit_many(
            [
                user_job("one-a", GPU_JOB, gpus=1, hold=True, trace=True),
                user_job("one-b", GPU_JOB, gpus=1, hold=True, trace=True),
                user_job("both", GPU_JOB, gpus=2),
                {
                    "name": "count",
                    "dataset": "reviews",
                    "blocks": {"last": 1},
                    "epsilon": 0.1,
                    "delta": 1e-9,
                    "job": {"kind": "statistic", "params": {"query": "count"}},
                },
                {
                    "name": "sgd",
                    "dataset": "reviews",
                    "blocks": {"last": 2},
                    "epsilon": 1.0,
                    "delta": 1e-8,
                    "job": {"kind": "dpsgd", "params": {"model": "logreg", "sample_rate": 0.25, "epochs": 1, "lr": 0.1}},
                },
            ]
        )
        one_a, one_b, both, count, sgd = runs
        holders = [client.runs.workdir(r.id) for r in (one_a, one_b)]
        wait_until(lambda: all((folder / "trace").exists() for folder in holders), check)  # each holds its GPU till released
        for folder in holders:
            (folder / "release").touch()
        wait_until(ended(client, *(r.id for r in runs)), check)
        assert [r.status for r in runs] == ["completed"] * 5, [r.message for r in runs]
        assert {one_a.metrics["gpus"], one_b.metrics["gpus"]} == {"0", "1"}
        assert one_a.metrics["started"] < one_b.metrics["ended"] and one_b.metrics["started"] < one_a.metrics["ended"]
        assert sorted(both.metrics["gpus"].split(",")) == ["0", "1"]
        assert f"pipeline {one_a.id} sees GPUs" in one_a.logs()
        assert count.metrics["query"] == "count" and sgd.metrics["steps"] > 0
        for run in runs:  # spending is at most the grant (all of it for user jobs)
            for key, grant in run.grant.items():
                assert np.all(run.consumed[key] <= grant + 1e-12)
        np.testing.assert_allclose(one_a.consumed[one_a.info.block_keys[0]], one_a.grant[one_a.info.block_keys[0]])
        assert client.audit().ok
        assert ray_jobs(ray_address, db) == sorted(str(r.id) for r in runs)


def test_jobs_timed_out_stopped_killed_or_cancelled_fail_with_their_grant_consumed_and_the_scheduler_goes_on(
    ray_address: str, db: Path, run_cli
):
    from ray.job_submission import JobSubmissionClient

    env = {"PRIVSCHED_DB": str(db)}
    with serving(db, ray_address) as check, connect(db) as client:
        expired = client.submit({**user_job("expired", HANGING_JOB, blocks=1), "max_runtime": "3s"})
        runs = client.submit_many([user_job(name, HANGING_JOB, blocks=1) for name in ("stopped", "killed", "cancelled")])
        stopped, killed, cancelled = runs
        # their output reaches their log files while they run
        wait_until(lambda: all(f"pipeline {r.id} is reading" in client.logs(r.id) for r in runs), check)
        assert [r.status for r in runs] == ["running"] * 3
        assert run_cli("logs", cancelled.id, env=env).stdout.count(f"pipeline {cancelled.id} is reading") == 1
        JobSubmissionClient(ray_address).stop_job(submission_id_of(client, stopped.id))
        os.kill(host_pid(*(client.runs.workdir(killed.id) / "job.pid").read_text().split()), signal.SIGKILL)
        assert run_cli("cancel", cancelled.id, env=env).stdout.strip() == f"pipeline {cancelled.id} cancelling"
        wait_until(ended(client, expired.id, *(r.id for r in runs)), check)
        assert (expired.status, expired.message) == ("failed", "killed after exceeding its max_runtime of 3 s")
        # its supervisor, stopped by Ray's SIGTERM, reports it (charged: it had read its data)
        assert (stopped.status, stopped.message) == ("failed", f"the job was stopped (signal {signal.SIGTERM}) before it ended")
        assert killed.status == "failed" and "killed by signal 9 without writing its result" in killed.message
        assert (cancelled.status, cancelled.message) == ("failed", "cancelled by its user while running")
        for run in (expired, *runs):  # conservative: each may have read its data
            key = run.info.block_keys[0]
            np.testing.assert_allclose(run.consumed[key], run.grant[key])
        assert "executor=ray" in run_cli("status", cancelled.id, env=env).stdout
        later = client.submit(user_job("later", GPU_JOB, blocks=1))
        wait_until(ended(client, later.id), check)
        assert later.status == "completed" and later.metrics["gpus"] == ""  # a job without GPUs sees none
        assert client.audit().ok


def host_pid(pid: str, namespace: str) -> int:
    """The pid, seen from here, of the process that is ``pid`` in PID namespace ``namespace``."""
    if namespace == os.readlink("/proc/self/ns/pid"):
        return int(pid)
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            nspid = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if nspid.split()[-1] == pid:
            return int(entry.name)
    raise AssertionError(f"no process {pid} in {namespace}")


def submission_id_of(client: Client, pipeline_id: int) -> str:
    return submission_id(launch_in(client.runs.root, pipeline_id, client.status(pipeline_id).started_at))


def test_a_restarted_scheduler_reattaches_to_running_jobs_instead_of_running_them_again(ray_address: str, db: Path, tmp_path: Path):
    env = {"PRIVSCHED_DB": str(db)}
    serve = ["serve", "--policy", "fcfs", "--executor", "ray", "--ray-address", ray_address, "--tick", "200ms"]
    first = subprocess.Popen(
        [sys.executable, "-m", "privsched", *serve],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
    )
    with connect(db) as client:
        wait_until(lambda: client.runs.recorded_pool() is not None, running(first))
        runs = client.submit_many([user_job(f"held{i}", GPU_JOB, gpus=1, hold=True, trace=True) for i in range(2)])
        traces = [client.runs.workdir(r.id) / "trace" for r in runs]
        wait_until(lambda: all(t.exists() for t in traces), running(first))
        first.send_signal(signal.SIGKILL)
        first.wait()
        restarted = subprocess.Popen(
            [sys.executable, "-m", "privsched", *serve, "--until-idle"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        )
        reattached = []
        for line in restarted.stdout:  # the jobs are held: still running when it looks
            if "was running before the restart" in line:
                reattached.append(line.split(": ", 1)[1].strip())
                if len(reattached) == len(runs):
                    break
        for trace in traces:
            (trace.parent / "release").touch()
        output, _ = restarted.communicate(timeout=PATIENCE)
        assert restarted.returncode == 0, output
        assert reattached == ["still running"] * len(runs), output
        assert [r.status for r in runs] == ["completed", "completed"]
        assert [t.read_text().splitlines() for t in traces] == [[f"{r.id} started"] for r in runs]
        assert ray_jobs(ray_address, db) == [str(r.id) for r in runs]
        assert client.audit().ok


def test_a_request_larger_than_the_cluster_is_rejected_at_submission(ray_address: str, db: Path, run_cli, tmp_path):
    env = {"PRIVSCHED_DB": str(db)}
    with connect(db) as client:
        client.run_until_idle(executor="ray", ray_address=ray_address)  # records the cluster's pool
        with pytest.raises(LedgerError, match="the job asks for 3 GPU"):
            client.submit(user_job("huge", GPU_JOB, gpus=3))
    spec = tmp_path / "huge.json"
    spec.write_text(json.dumps(user_job("huge", GPU_JOB, gpus=3)))
    rejected = run_cli("submit", spec, env=env)
    assert rejected.returncode == 1
    assert rejected.stderr.strip() == "error: pipeline 'huge': the job asks for 3 GPU(s) but the pool has 2"


@pytest.mark.slow
def test_a_dpsgd_pipeline_asking_for_two_workers_trains_on_two_processes_on_one_node(ray_address: str, db: Path):
    with serving(db, ray_address) as check, connect(db) as client:
        job = {"kind": "dpsgd", "params": {"model": "logreg", "sample_rate": 0.25, "epochs": 1, "lr": 0.1}}
        spec = {"name": "dp2", "dataset": "reviews", "blocks": {"last": 2}, "epsilon": 1.0, "delta": 1e-8, "job": job}
        run = client.submit({**spec, "resources": {"workers": 2}})
        wait_until(ended(client, run.id), check)
        assert run.status == "completed", run.message
        assert run.metrics["workers"] == 2 and run.metrics["steps"] == 4 and client.audit().ok


def test_a_job_no_node_can_hold_fails_without_touching_data(ray_address: str, db: Path):
    with serving(db, ray_address, gpus=4) as check, connect(db) as client:  # a pool larger than the cluster
        run = client.submit(user_job("huge", GPU_JOB, gpus=3))
        wait_until(ended(client, run.id), check)
        assert run.status == "failed"
        assert run.message.startswith("the job could not be started: no node of the Ray cluster can hold 3 GPU(s)")
        assert all(not np.any(c) for c in run.consumed.values())  # released: the job never ran
        assert ray_jobs(ray_address, db) == [] and client.audit().ok


def test_a_job_the_cluster_does_not_know_is_settled_from_its_result_file_or_failed(ray_address: str, tmp_path: Path):
    executor = RayExecutor(ray_address)
    done, lost = launch_in(tmp_path, 1, 1.0), launch_in(tmp_path, 2, 1.0)  # never submitted to this cluster
    done.result.parent.mkdir(parents=True)
    write_atomic(done.result, JobResult(1, True, {"b0": [0.25]}).to_json())  # read before a scheduler crash
    assert executor.attach(done) is False and executor.attach(lost) is False
    results = {r.pipeline_id: r for r in executor.poll(time.time())}
    assert results[1].completed and results[1].spent == {"b0": [0.25]}
    assert (results[2].completed, results[2].touched_data) == (False, True)
    assert results[2].message == "job vanished from the Ray cluster without writing its result"
    assert executor.running() == set()
