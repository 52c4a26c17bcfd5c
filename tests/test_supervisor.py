"""The job supervisor (``python -m privsched.jobs.runner``) on real processes: what it
believes of a job's report, how it ends a job's processes, and Landlock itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.budgets import Accounting
from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.runner import JobResult
from privsched.jobs.sandbox import abi_version

REPO = Path(__file__).resolve().parents[1]
ABI = abi_version()
needs_landlock = pytest.mark.skipif(ABI == 0, reason="this kernel offers no Landlock sandbox")
GRANT = [0.5, 1e-9]


def write_context(folder: Path, job: dict, blocks: dict[str, str], **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    ctx = JobContext(
        1,
        "job",
        "reviews",
        Accounting.basic(),
        1e-9,
        {k: BlockGrant(k, loc, np.array(GRANT)) for k, loc in blocks.items()},
        workdir=folder / "work",
        params=extra.pop("params", {}),
    )
    path = folder / "context.json"
    path.write_text(json.dumps({**json.loads(ctx.to_json()), "job": job, **extra}))
    return path


def supervise(context: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "privsched.jobs.runner", str(context), str(context.parent / "result.json"), *args],
        env=env,
        cwd=context.parent,
    )


def result_of(context: Path, *args: str) -> JobResult:
    assert supervise(context, *args).wait(timeout=120) in (0, 1)
    return JobResult.from_json((context.parent / "result.json").read_text())


def hostile(name: str) -> dict:
    return {"function": f"tests.sandbox_jobs:{name}", "pythonpath": [str(REPO)]}


def blocks(tmp_path: Path) -> dict[str, str]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    for key in ("d1", "d2"):
        np.savez(data / f"{key}.npz", rating=np.linspace(0, 5, 40), vocab_size=np.asarray(5), n_categories=np.asarray(2))
    return {k: str(data / f"{k}.npz") for k in ("d1", "d2")}


def test_a_built_in_job_keeps_its_measured_spend(tmp_path: Path):
    job = {"kind": "statistic", "query": "count"}
    from privsched.budgets.mechanisms import mechanism_json
    from privsched.trainers.builtin import plan_mechanism

    plan = json.loads(mechanism_json(plan_mechanism(job, 0.2, 0.0, Accounting.basic())))
    result = result_of(write_context(tmp_path / "run", job, blocks(tmp_path), params=job, plan=plan, epsilon=0.2))
    assert result.completed and result.spent == {"d1": [0.2, 0.0], "d2": [0.2, 0.0]}


def test_a_user_job_report_is_not_believed(tmp_path: Path):
    context = write_context(tmp_path / "run", hostile("reads_then_reports_zero"), blocks(tmp_path))
    result = result_of(context, "--sandbox", "none")
    assert result.completed and result.spent == {"d1": GRANT, "d2": GRANT}
    assert result.metrics["sandbox"] == "none"


@needs_landlock
def test_a_user_job_reads_its_granted_blocks_through_descriptors_and_is_charged_its_grant(tmp_path: Path):
    context = write_context(tmp_path / "run", hostile("reads_then_reports_zero"), blocks(tmp_path))
    result = result_of(context)
    assert result.completed and result.spent == {"d1": GRANT, "d2": GRANT}


@needs_landlock
def test_primitives_are_refused_beyond_the_grant_and_charged_as_they_go(tmp_path: Path):
    job = hostile("counts_then_stops")
    context = write_context(tmp_path / "run", job, blocks(tmp_path), params={"epsilon": 0.2, "too_much": 0.31})
    result = result_of(context)
    assert result.completed and result.metrics["refused"] is True
    assert result.spent == {"d1": [0.2, 0.0], "d2": [0.2, 0.0]}
    assert abs(result.metrics["count"] - 80) < 200  # 80 records, Laplace noise of scale 5


@needs_landlock
def test_a_user_job_that_raises_before_reaching_its_data_is_charged_nothing(tmp_path: Path):
    job = {"function": "tests.service_jobs:raises_before_reading", "pythonpath": [str(REPO)]}
    result = result_of(write_context(tmp_path / "run", job, blocks(tmp_path)))
    assert not result.completed and not result.touched_data and result.first_access is None
    assert result.message.startswith("the job raised ValueError")


@needs_landlock
def test_a_user_job_that_raises_after_opening_a_block_has_touched_its_data(tmp_path: Path):
    job = {"function": "tests.service_jobs:raises_after_reading", "pythonpath": [str(REPO)]}
    started = time.time()
    result = result_of(write_context(tmp_path / "run", job, blocks(tmp_path)))
    assert not result.completed and result.touched_data
    assert result.first_access is not None and result.first_access >= started


@needs_landlock
def test_a_confined_user_job_that_completes_without_reaching_its_data_is_charged_nothing(tmp_path: Path):
    result = result_of(write_context(tmp_path / "run", hostile("records_start"), blocks(tmp_path)))
    assert result.completed and result.spent == {"d1": [0.0, 0.0], "d2": [0.0, 0.0]} and result.first_access is None


def test_an_unconfined_user_job_that_fails_counts_as_having_touched_its_data(tmp_path: Path):
    job = {"function": "tests.service_jobs:raises_before_reading", "pythonpath": [str(REPO)]}
    result = result_of(write_context(tmp_path / "run", job, blocks(tmp_path)), "--sandbox", "none")
    assert not result.completed and result.touched_data  # it could have read context.json's locations


@needs_landlock
@pytest.mark.parametrize("read", [False, True])
def test_a_stopped_job_is_charged_its_grant_only_once_it_reached_its_data(tmp_path: Path, read: bool):
    context = write_context(tmp_path / "run", hostile("waits"), blocks(tmp_path), params={"read": read})
    process = supervise(context)
    started = tmp_path / "run" / "work" / "started"
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "the job never started"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 1
    result = JobResult.from_json((tmp_path / "run" / "result.json").read_text())
    assert not result.completed and result.touched_data is read
    assert result.message == f"the job was stopped (signal {signal.SIGTERM}) before it ended"


@needs_landlock
def test_a_block_that_is_a_folder_reaches_the_job_as_one_descriptor_per_file(tmp_path: Path):
    folder = tmp_path / "parts"
    (folder / "2026").mkdir(parents=True)
    (folder / "a.parquet").write_bytes(b"x" * 3)
    (folder / "2026" / "b.parquet").write_bytes(b"y" * 5)
    (folder / "link.parquet").symlink_to(folder / "a.parquet")  # not a file of the block
    result = result_of(write_context(tmp_path / "run", hostile("reads_block_files"), {"d1": str(folder)}))
    assert result.completed, result.message
    assert result.metrics["sizes"] == {"2026/b.parquet": 5, "a.parquet": 3}


@needs_landlock
def test_a_confined_job_reads_a_parquet_block_from_its_descriptor(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"rating": [1.0, 2.0, 3.0]}), tmp_path / "b.parquet")
    result = result_of(write_context(tmp_path / "run", hostile("reads_parquet"), {"d1": str(tmp_path / "b.parquet")}))
    assert result.completed, result.message
    assert (result.metrics["columns"], result.metrics["rows"]) == (["rating"], 3)


@needs_landlock
def test_a_confined_job_can_neither_stat_open_nor_list_its_blocks_and_is_never_told_where_they_are(tmp_path: Path):
    files = blocks(tmp_path)
    params = {"files": list(files.values()), "folders": [str(tmp_path / "data"), str(tmp_path)]}
    result = result_of(write_context(tmp_path / "run", hostile("probes_its_blocks"), files, params=params))
    assert result.completed, result.message
    assert result.metrics["reached"] == [] and result.metrics["locations"] == [None, None]
    # Not even stat: the block files and their folder do not exist in the job's mount
    # namespace (tmp_path does: it holds the job's own run folder).
    assert result.metrics["seen"] == [str(tmp_path)]
    assert result.metrics["brokered_bytes"] == Path(files["d1"]).stat().st_size


@needs_landlock
def test_a_job_is_not_started_when_its_readable_folders_hold_a_protected_path(tmp_path: Path):
    context = write_context(
        tmp_path / "run", hostile("reads_then_reports_zero"), blocks(tmp_path), protected=[str(REPO / "tests" / "ledger.db")]
    )  # beside the job's own code
    result = result_of(context)
    assert not result.completed and not result.touched_data
    assert "ledger.db" in result.message and result.message.startswith("not started")
    assert "the folder `ray start` ran in" in result.message  # the layout it needs, for a Ray job too


def test_a_job_that_dies_without_reporting_fails_with_its_data_assumed_touched(tmp_path: Path):
    job = {"function": "tests.service_jobs:exits_without_result", "pythonpath": [str(REPO)]}
    result = result_of(write_context(tmp_path / "run", job, blocks(tmp_path)), "--sandbox", "none")
    assert not result.completed and result.touched_data


def test_a_terminated_supervisor_takes_the_jobs_detached_processes_with_it(tmp_path: Path):
    context = write_context(tmp_path / "run", hostile("leaves_a_daemon"), blocks(tmp_path), params={"hang": True})
    process = supervise(context, "--sandbox", "none")
    pid_file = tmp_path / "run" / "work" / "daemon.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    daemon = int(pid_file.read_text())
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 1  # its job failed: stopped
    assert _gone(daemon)


def _gone(pid: int) -> bool:
    """Whether a process no longer runs (gone, or a zombie waiting for its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2 :].split()[0] in ("Z", "X")


@needs_landlock
def test_confine_denies_reads_writes_and_tcp_outside_the_rules(tmp_path: Path):
    allowed, secret = tmp_path / "allowed", tmp_path / "secret.txt"
    allowed.mkdir()
    secret.write_text("secret")
    script = textwrap.dedent(f"""
        import socket, sys
        from privsched.jobs.sandbox import Confinement, confine, python_roots
        confine(Confinement(read=tuple(python_roots()), write=({str(allowed)!r},)))
        open({str(allowed / "out.txt")!r}, "w").write("ok")
        for attempt in (lambda: open({str(secret)!r}).read(), lambda: open({str(tmp_path / "new.txt")!r}, "w"),
                        lambda: socket.create_connection(("127.0.0.1", 9), timeout=2)):
            try:
                attempt()
            except PermissionError:
                print("denied")
            except OSError as exc:
                print("other", exc)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    output = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    lines = output.stdout.split()
    assert output.returncode == 0, output.stderr
    assert (allowed / "out.txt").read_text() == "ok"
    assert lines == ["denied"] * (3 if ABI >= 4 else 2) + ([] if ABI >= 4 else ["other"])


@pytest.fixture(scope="module")
def account_blocks(tmp_path_factory) -> dict[str, str]:
    return blocks(tmp_path_factory.mktemp("account"))


def account_for(block_files: dict[str, str], folder: Path):
    from privsched.jobs.primitives import Account

    ctx = JobContext(
        1,
        "job",
        "reviews",
        Accounting.basic(),
        1e-9,
        {k: BlockGrant(k, loc, np.array(GRANT)) for k, loc in block_files.items()},
        workdir=folder,
    )
    return Account(ctx)


@given(st.lists(st.floats(0.001, 0.6), max_size=8))
@settings(max_examples=40, deadline=None)
def test_primitives_charge_what_they_released_and_refuse_anything_beyond_the_grant(account_blocks, epsilons):
    account = account_for(account_blocks, Path(tempfile.mkdtemp()))
    released = 0.0
    for epsilon in epsilons:
        try:
            account.handle({"op": "count", "epsilon": epsilon})
            released += epsilon
        except PermissionError:
            assert released + epsilon > GRANT[0] * (1 - 1e-12)
    assert account.spent[0] == pytest.approx(released, rel=1e-12, abs=1e-15)
    assert account.spent[0] <= GRANT[0] and bool(account.releases) == bool(released)


def test_a_primitive_takes_its_noise_by_name_and_refuses_the_word_mechanism(account_blocks):
    account = account_for(account_blocks, Path(tempfile.mkdtemp()))
    with pytest.raises(ValueError, match="'noise'"):
        account.handle({"op": "count", "epsilon": 0.1, "delta": 1e-10, "mechanism": "gaussian"})
    assert not account.releases and account.spent[0] == 0
    account.handle({"op": "count", "epsilon": 0.1, "delta": 1e-10, "noise": "gaussian"})
    assert account.spent == pytest.approx([0.1, 1e-10])


@given(
    st.binary(max_size=200)
    | st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=8)), max_size=5).map(
        lambda d: json.dumps(d).encode()
    )
)
@settings(max_examples=100, deadline=None)
def test_any_request_gets_an_answer_and_never_charges_beyond_the_grant(account_blocks, line):
    account = account_for(account_blocks, Path(tempfile.mkdtemp()))
    report, answer, fds = account._answer(line)
    assert (report is None) != (answer is None) and fds == []
    if answer is not None:
        assert set(json.loads(answer)) <= {"ok", "error"}
    assert np.all(account.spent <= np.array(GRANT)) and not account.read_blocks and account.first_access is None


@needs_landlock
@pytest.mark.skipif(ABI < 4, reason="Landlock TCP rules need ABI 4")
@pytest.mark.parametrize(("asks", "allowed", "connects"), [(True, True, True), (True, False, False), (False, True, False)])
def test_tcp_stays_open_only_when_the_pipeline_asks_and_the_operator_allows(tmp_path: Path, asks, allowed, connects):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        job = {**hostile("connects"), "network": asks}
        context = write_context(tmp_path / "run", job, blocks(tmp_path), params={"port": server.getsockname()[1]})
        result = result_of(context, *(["--network"] if allowed else []))
    assert result.completed is connects
    assert connects or result.message.startswith("the job raised PermissionError")
