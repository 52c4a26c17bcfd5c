"""The local executor and the job runner, on real processes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from privsched.budgets import Accounting
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult
from privsched.service.executors import make_executor
from privsched.service.executors.base import Launch
from privsched.service.executors.local import LocalExecutor
from privsched.service.resources import Placement
from tests.support.waiting import PATIENCE, wait_for

REPO = Path(__file__).resolve().parents[1]
GRANT = [1.0, 1e-9]


def launch_for(
    folder: Path,
    function: str,
    *,
    pipeline_id: int = 1,
    gpus: tuple[str, ...] = (),
    max_runtime: float | None = None,
    params: dict | None = None,
) -> Launch:
    folder.mkdir(parents=True, exist_ok=True)
    ctx = JobContext(
        pipeline_id=pipeline_id,
        name="job",
        dataset="reviews",
        accounting=Accounting.basic(),
        delta=1e-9,
        blocks={k: BlockGrant(k, block_file(folder, k), np.array(GRANT)) for k in ("d1", "d2")},
        device="cuda" if gpus else "cpu",
        workdir=folder,
        params=params or {},
    )
    job = {"function": f"tests.service_jobs:{function}", "pythonpath": [str(REPO)]}
    (folder / "context.json").write_text(json.dumps({**json.loads(ctx.to_json()), "job": job}))
    return Launch(
        pipeline_id, folder / "context.json", folder / "result.json", folder / "job.log", Placement(gpus, 1.0, 0), time.time(), max_runtime
    )


def block_file(folder: Path, key: str) -> str:
    path = folder.parent / f"{folder.name}-{key}.npz"
    np.savez(path, rating=np.arange(4.0))
    return str(path)


def run_to_end(executor: LocalExecutor, *launches: Launch, ahead: float = 0.0) -> dict[int, JobResult]:
    """Start ``launches`` and poll until every job has ended, on a clock ``ahead`` seconds
    ahead of the wall clock."""
    for launch in launches:
        executor.start(launch)
    results: dict[int, JobResult] = {}

    def ended() -> bool:
        for result in executor.poll(time.time() + ahead):
            results[result.pipeline_id] = result
        return not executor.running()

    wait_for(ended, "every job the executor started has ended")
    return results


def test_a_user_jobs_reported_spending_is_not_believed_it_is_charged_its_grant(tmp_path: Path):
    result = run_to_end(LocalExecutor(), launch_for(tmp_path, "spend_half"))[1]
    assert result.completed and result.touched_data
    assert result.spent == {"d1": GRANT, "d2": GRANT}
    assert result.metrics == {"blocks": 2}


def test_a_job_that_does_not_report_is_charged_its_whole_grant(tmp_path: Path):
    result = run_to_end(LocalExecutor(), launch_for(tmp_path, "no_report"))[1]
    assert result.completed and result.spent == {"d1": GRANT, "d2": GRANT}


def test_a_job_that_failed_counts_as_having_touched_data_only_after_it_reached_it(tmp_path: Path):
    executor = LocalExecutor()
    results = run_to_end(
        executor,
        launch_for(tmp_path / "a", "raises_after_reading", pipeline_id=1),
        launch_for(tmp_path / "b", "raises_before_reading", pipeline_id=2),
        launch_for(tmp_path / "c", "reads_foreign_block", pipeline_id=3),
    )
    assert (results[1].completed, results[1].touched_data) == (False, True)
    assert results[1].message == "the job raised RuntimeError: the model diverged" and results[1].first_access is not None
    assert (results[2].completed, results[2].touched_data, results[2].first_access) == (False, False, None)
    assert results[3].message.startswith("the job raised BlockAccessError") and not results[3].touched_data
    assert "Traceback" in (tmp_path / "a" / "job.log").read_text()


def test_a_job_that_exits_without_its_result_fails_conservatively(tmp_path: Path):
    result = run_to_end(LocalExecutor(), launch_for(tmp_path, "exits_without_result"))[1]
    assert not result.completed and result.touched_data
    assert result.message == "job exited with code 0 without writing its result"


#: A job's longest run in the max_runtime tests, far shorter than the hour the jobs would
#: sleep. Once the job is where the test wants it (an event), the executor is polled on a
#: clock this far ahead: its deadline has passed, and no test waits it out.
MAX_RUNTIME = 10.0


def test_a_job_past_its_max_runtime_is_killed_and_failed(tmp_path: Path):
    assert PATIENCE < 3600  # so run_to_end fails if the job is left to sleep its hour
    executor = LocalExecutor()
    executor.start(launch_for(tmp_path, "hangs", max_runtime=MAX_RUNTIME))
    wait_for((tmp_path / "reached").exists, "the job opened its block")
    result = run_to_end(executor, ahead=MAX_RUNTIME)[1]
    assert not result.completed and result.touched_data
    assert "max_runtime of 10 s" in result.message  # killed, not left to sleep its hour


def test_a_job_past_its_max_runtime_before_reaching_its_data_is_charged_nothing(tmp_path: Path):
    executor = LocalExecutor()
    executor.start(launch_for(tmp_path, "sleep_then_spend", max_runtime=MAX_RUNTIME, params={"seconds": 3600}))
    wait_for((tmp_path / "sleeping").exists, "the job started its sleep, before reading any block")
    result = run_to_end(executor, ahead=MAX_RUNTIME)[1]
    assert not result.completed and not result.touched_data
    assert "max_runtime of 10 s" in result.message


def test_cancel_stops_the_job(tmp_path: Path):
    executor = LocalExecutor()
    executor.start(launch_for(tmp_path, "hangs"))
    executor.cancel(1, "cancelled by its user")
    results = run_to_end(executor)
    assert results[1].message == "cancelled by its user" and not results[1].completed


def test_the_job_sees_only_its_gpus_and_logs_to_its_file(tmp_path: Path):
    run_to_end(
        LocalExecutor(),
        launch_for(tmp_path / "gpu", "writes_environment", gpus=("1", "3")),
        launch_for(tmp_path / "cpu", "writes_environment", pipeline_id=2),
    )
    assert (tmp_path / "gpu" / "env.txt").read_text() == "'1,3' cuda\n"
    assert (tmp_path / "cpu" / "env.txt").read_text() == "'' cpu\n"
    assert "hello from pipeline 2" in (tmp_path / "cpu" / "job.log").read_text()


def test_a_new_executor_attaches_to_a_job_an_earlier_one_started(tmp_path: Path):
    first = LocalExecutor()
    launch = launch_for(tmp_path, "sleep_then_spend", params={"seconds": 1.5})
    first.start(launch)
    second = LocalExecutor()  # as after a scheduler restart
    assert second.attach(launch) is True
    result = run_to_end(second)[1]
    assert result.completed and result.spent == {"d1": GRANT, "d2": GRANT}
    first.poll(time.time())  # reap the child


def test_attaching_to_a_job_that_is_gone_reports_its_result_file_or_a_failure(tmp_path: Path):
    done = launch_for(tmp_path / "done", "spend_half")
    run_to_end(LocalExecutor(), done)
    lost = launch_for(tmp_path / "lost", "spend_half", pipeline_id=2)  # never started: no pid, no result
    executor = LocalExecutor()
    assert executor.attach(done) is False and executor.attach(lost) is False
    results = {r.pipeline_id: r for r in executor.poll(time.time())}
    assert results[1].completed
    assert not results[2].completed and results[2].touched_data


def test_unknown_executor_name_is_refused():
    with pytest.raises(ValueError, match="unknown executor 'slurm'"):
        make_executor("slurm")


def test_a_supervisors_environment_is_built_from_the_allow_list(tmp_path: Path, monkeypatch):
    """The operator's token and cloud keys never reach a job's supervisor (whose
    ``/proc/<pid>/environ`` a job under a shared PID namespace could read)."""
    monkeypatch.setenv("PRIVSCHED_TOKEN", "s3cr3t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    launch = launch_for(tmp_path / "job", "writes_environment")
    environment = LocalExecutor(warm=False)._environment(launch)
    assert "s3cr3t" not in str(environment)
    assert environment["CUDA_VISIBLE_DEVICES"] == "" and environment["OMP_NUM_THREADS"] == "1"
