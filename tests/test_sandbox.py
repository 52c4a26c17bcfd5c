"""Job confinement on real processes: Landlock, the supervisor, untrusted spend.

Every test runs real jobs under the real scheduler and a real ledger; they are skipped
where the kernel offers no Landlock (the supervisor's own tests are in test_supervisor.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest

from privsched import connect
from privsched.client import Client
from privsched.jobs.sandbox import Confinement, abi_version, exposed, sandbox_mode
from privsched.ledger import LedgerError
from privsched.service.rundirs import RunDirs
from privsched.service.serve import ServiceError

REPO = Path(__file__).resolve().parents[1]
ABI = abi_version()
needs_landlock = pytest.mark.skipif(ABI == 0, reason="this kernel offers no Landlock sandbox")
GRANT = 0.4


@pytest.fixture
def client(tmp_path: Path) -> Client:
    """Dataset ``reviews`` (basic, ε_G = 10) with blocks b0, b1 backed by real .npz files."""
    data = tmp_path / "data"
    data.mkdir()
    for i, key in enumerate(("b0", "b1")):  # distinct records: the same data is never registered twice
        np.savez(data / f"{key}.npz", rating=np.arange(10.0) + i, vocab_size=np.asarray(5), n_categories=np.asarray(2))
    client = connect(tmp_path / "ledger.db")
    client.create_dataset("reviews", epsilon=10.0, delta=1e-6, accounting="basic")
    client.add_blocks("reviews", [(k, str(data / f"{k}.npz")) for k in ("b0", "b1")])
    yield client
    client.close()


def run(client: Client, function: str, blocks: tuple[str, ...] = ("b0",), pythonpath: tuple[str, ...] = (str(REPO),), **params):
    """Submit one user job, serve until idle, and return its final record."""
    spec = {
        "name": function,
        "dataset": "reviews",
        "blocks": list(blocks),
        "epsilon": GRANT,
        "job": {"function": f"tests.sandbox_jobs:{function}", "pythonpath": list(pythonpath), "params": params},
    }
    pipeline = client.submit(spec)
    client.run_until_idle("fcfs", tick=0.05, cpus=2, gpus=0)
    return client.status(pipeline.id)


def consumed(client: Client, key: str) -> float:
    return float(client.ledger.get_block("reviews", key).consumed[0])


def assert_failed_with_permission_error(client: Client, info) -> None:
    """Failed, charged its grant, denied the path (Landlock) or not even shown it (its mount
    namespace holds only what it may reach)."""
    assert info.state == "failed"
    assert any(word in (info.message or "") for word in ("PermissionError", "Permission denied", "FileNotFoundError")), info.message
    assert consumed(client, "b0") == 0.0  # refused before it reached its own data: charged nothing


@needs_landlock
def test_a_job_cannot_open_another_blocks_file(client: Client):
    info = run(client, "reads_file", path=client.ledger.get_block("reviews", "b1").location)
    assert_failed_with_permission_error(client, info)


@needs_landlock
def test_a_job_cannot_open_the_ledger_database(client: Client):
    info = run(client, "reads_file", path=str(client.path))
    assert_failed_with_permission_error(client, info)


@needs_landlock
def test_a_job_cannot_write_outside_its_work_folder(client: Client, tmp_path: Path):
    info = run(client, "writes_file", path=str(tmp_path / "planted.txt"))
    assert_failed_with_permission_error(client, info)
    assert not (tmp_path / "planted.txt").exists()


@needs_landlock
@pytest.mark.skipif(ABI < 4, reason="Landlock TCP rules need ABI 4")
def test_a_job_cannot_open_a_tcp_connection(client: Client):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        info = run(client, "connects", port=server.getsockname()[1])
    assert_failed_with_permission_error(client, info)


@needs_landlock
def test_a_job_cannot_touch_the_files_of_other_runs_or_of_the_scheduler(client: Client):
    first = run(client, "reads_then_reports_zero")
    runs = RunDirs(client.path)
    targets = {
        "delete": [runs.result(first.id), runs.log(first.id), runs.root / "pool.json"],
        "write": [runs.cancel_request(first.id), runs.root / "pool.json", runs.workdir(first.id) / "x"],
    }
    before = {p: p.read_bytes() for p in targets["delete"]}
    for path in targets["delete"]:
        assert run(client, "deletes_file", path=str(path)).state == "failed"
    for path in targets["write"]:
        assert run(client, "writes_file", path=str(path)).state == "failed"
    assert {p: p.read_bytes() for p in targets["delete"]} == before
    assert not runs.cancel_request(first.id).exists() and not (runs.workdir(first.id) / "x").exists()


@needs_landlock
def test_a_user_job_that_reads_its_data_and_reports_zero_is_charged_its_grant(client: Client):
    info = run(client, "reads_then_reports_zero", blocks=("b0", "b1"))
    assert info.state == "completed"
    assert consumed(client, "b0") == consumed(client, "b1") == pytest.approx(GRANT)


@needs_landlock
def test_a_job_that_spends_through_primitives_and_stops_early_is_refunded_the_rest(client: Client):
    info = run(client, "counts_then_stops", blocks=("b0", "b1"), epsilon=0.1, too_much=0.35)
    assert info.state == "completed"
    assert consumed(client, "b0") == consumed(client, "b1") == 0.1  # exactly the one count
    block = client.ledger.get_block("reviews", "b0")
    assert float(block.allocated[0]) == 0.0


@needs_landlock
def test_no_process_of_a_job_survives_its_pipeline(client: Client):
    info = run(client, "leaves_a_daemon")
    assert info.state == "completed"
    namespace = (RunDirs(client.path).workdir(info.id) / "daemon.ns").read_text()
    assert namespace != os.readlink("/proc/self/ns/pid")  # the job had a PID namespace of its own
    assert [p for p in Path("/proc").glob("[0-9]*") if _namespace(p) == namespace] == []


def _namespace(process: Path) -> str | None:
    try:
        return os.readlink(process / "ns" / "pid")
    except OSError:
        return None


@needs_landlock
def test_run_folders_and_result_files_are_private_to_their_owner(client: Client):
    info = run(client, "reads_then_reports_zero")
    runs = RunDirs(client.path)
    for folder in (runs.root, runs.folder(info.id), runs.workdir(info.id)):
        assert folder.stat().st_mode & 0o777 == 0o700
    for path in (runs.result(info.id), runs.log(info.id), runs.context(info.id), runs.pid_file(info.id)):
        assert path.stat().st_mode & 0o777 == 0o600


def test_the_status_of_a_job_says_when_it_ran_unconfined(client: Client):
    spec = {
        "name": "free",
        "dataset": "reviews",
        "blocks": ["b0"],
        "epsilon": GRANT,
        "job": {"function": "tests.sandbox_jobs:reads_then_reports_zero", "pythonpath": [str(REPO)]},
    }
    pipeline = client.submit(spec)
    client.run_until_idle("fcfs", tick=0.05, cpus=2, gpus=0, sandbox="none")
    info = client.status(pipeline.id)
    assert info.state == "completed" and info.placement["sandbox"] == "none"
    assert consumed(client, "b0") == pytest.approx(GRANT)


def test_serving_without_landlock_is_refused_unless_the_operator_opts_out(client: Client, monkeypatch):
    import privsched.jobs.sandbox as sandbox

    monkeypatch.setattr(sandbox, "abi_version", lambda: 0)
    with pytest.raises(ServiceError, match="--sandbox none"):
        client.run_until_idle("fcfs", tick=0.05, cpus=2, gpus=0)


def test_serving_without_user_namespaces_is_refused_in_one_line_unless_the_operator_opts_out(client: Client, monkeypatch):
    import privsched.jobs.namespaces as namespaces

    monkeypatch.setattr(namespaces, "available", lambda: "user namespaces are unavailable (unshare failed: Operation not permitted)")
    with pytest.raises(ServiceError, match="user namespaces are unavailable .*: pass --sandbox none") as refused:
        client.run_until_idle("fcfs", tick=0.05, cpus=2, gpus=0)
    assert "\n" not in str(refused.value)
    client.run_until_idle("fcfs", tick=0.05, cpus=2, gpus=0, sandbox="none")  # served unconfined on request


def test_an_unknown_sandbox_mode_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("PRIVSCHED_SANDBOX", "chroot")
    with pytest.raises(ValueError, match="unknown sandbox 'chroot'"):
        sandbox_mode()
    assert sandbox_mode("none") == "none"


def test_protected_paths_under_a_readable_folder_are_found(tmp_path: Path):
    inside, outside = tmp_path / "env" / "ledger.db", tmp_path / "data" / "b1.npz"
    rules = Confinement(read=(str(tmp_path / "env"),), write=())
    assert exposed(rules.read, [str(inside), str(outside)]) == [str(inside)]


@pytest.fixture
def client_in_checkout(tmp_path: Path) -> Client:
    """Like ``client``, but the ledger and the data live inside this source checkout, beside
    the privsched package, as ``./dev demo`` keeps them (``runs/demo``)."""
    folder = Path(tempfile.mkdtemp(prefix=".sandbox-test-", dir=REPO))
    try:
        data = folder / "data"
        data.mkdir()
        for i, key in enumerate(("b0", "b1")):  # distinct records: the same data is never registered twice
            np.savez(data / f"{key}.npz", rating=np.arange(10.0) + i)
        client = connect(folder / "ledger.db")
        client.create_dataset("reviews", epsilon=10.0, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", [(k, str(data / f"{k}.npz")) for k in ("b0", "b1")])
        yield client
        client.close()
    finally:
        shutil.rmtree(folder)


@needs_landlock
def test_a_ledger_inside_the_source_checkout_stays_out_of_reach_and_jobs_still_run(client_in_checkout: Client):
    """Jobs import privsched as installed, reading its package folder only: neither the
    checkout's folder (where the ledger lies) nor anything beside the package is readable,
    so jobs start, and cannot open the ledger."""
    client = client_in_checkout
    count = client.submit(
        {
            "name": "count",
            "dataset": "reviews",
            "blocks": ["b0"],
            "epsilon": GRANT,
            "job": {"kind": "statistic", "params": {"query": "count"}},
        }
    )
    client.run_until_idle("fcfs", tick=0.05, cpus=2, gpus=0)
    assert client.status(count.id).state == "completed", client.status(count.id).message
    with pytest.raises(LedgerError, match="holds"):  # a pythonpath holding the ledger is refused at submit
        run(client, "reads_file", blocks=("b1",), path=str(client.path))
    info = run(client, "reads_file", blocks=("b1",), pythonpath=(), path=str(client.path))  # found on the import path
    assert info.state == "failed" and ("Permission" in (info.message or "") or "FileNotFound" in (info.message or ""))
