"""The command line through ``--server``: a real ``privsched serve --listen`` process on the
loopback gives the same output and exit status as local use, and a server killed
mid-request loses no acknowledged submission and duplicates none."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import privsched as ps
from privsched.ledger import Ledger
from privsched.remote import RemoteError
from tests.conftest import REPO, dump_database
from tests.server_fixtures import make_database


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Served:
    """A ``privsched serve`` process with its HTTP API on a fixed loopback port."""

    def __init__(self, db: Path, port: int) -> None:
        self.db, self.port = db, port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "PRIVSCHED_DB": str(self.db), "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "privsched",
                "serve",
                "--policy",
                "fcfs",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--tick",
                "100ms",
                "--cpus",
                "2",
                "--gpus",
                "0",
                "--memory",
                "1G",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.db.parent,
        )
        summary = [self.process.stdout.readline() for _ in range(5)]  # printed once it holds the database
        assert summary[-1].startswith("  HTTP API  http://127.0.0.1:"), "".join(summary) + self.process.stdout.read()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.communicate(timeout=60)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    db = tmp_path / "p.db"
    served = Served(db, free_port())
    served.tokens = make_database(db)
    served.start()
    yield served
    served.stop()


def write(folder: Path, name: str, blocks: str, epsilon: float) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ndataset: reviews\nblocks: {blocks}\nepsilon: {epsilon}\njob: {{function: 'tests.service_jobs:spend_half'}}\n"
    )
    return path


def wait_until(predicate, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.1)


def test_commands_through_the_server_print_what_they_print_locally(served: Served, run_cli, tmp_path: Path):
    local = {"PRIVSCHED_DB": str(served.db)}
    remote = {"PRIVSCHED_SERVER": served.url, "PRIVSCHED_TOKEN": served.tokens["admin"], "PRIVSCHED_DB": "/nonexistent"}
    first = run_cli("submit", write(tmp_path, "a", "[b0, b1]", 0.6), env=remote)
    assert (first.returncode, first.stdout) == (0, "1\n"), first.stderr
    done = run_cli("submit", write(tmp_path, "b", "[b2]", 0.3), "--wait", env=remote)
    assert (done.returncode, done.stdout) == (0, "pipeline 2 completed\nmetric blocks: 1\n"), done.stderr  # and what it released
    wait_until(lambda: ps.connect(served.db).status(1).state == "completed")
    assert run_cli("submit", write(tmp_path, "c", "[b0]", 0.8), env=remote).stdout == "3\n"  # b0 has 0.7 left: never
    commands = [
        ["list"],
        ["list", "--state", "pending"],
        ["status", "1"],
        ["status", "3"],
        ["logs", "1"],
        ["budget", "show"],
        ["budget", "show", "reviews"],
        ["blocks", "list", "reviews"],
        ["dataset", "list"],
        ["audit"],
        ["audit", "--export"],
        ["status", "99"],
        ["cancel", "1"],
        ["logs", "99"],
        ["budget", "show", "nope"],
        ["submit", tmp_path / "missing.yaml"],
    ]
    for command in commands:
        here, there = run_cli(*command, env=local), run_cli(*command, env=remote)
        assert (there.returncode, there.stdout, there.stderr) == (here.returncode, here.stdout, here.stderr), command
    hangs = write(tmp_path, "h", "[b3]", 0.1)
    hangs.write_text(hangs.read_text().replace("spend_half", "hangs"))
    assert run_cli("submit", hangs, env=remote).stdout == "4\n"
    wait_until(lambda: ps.connect(served.db).status(4).state == "running")
    cancelled = run_cli("cancel", "4", env=remote)
    assert (cancelled.returncode, cancelled.stdout) == (0, "pipeline 4 cancelling\n"), cancelled.stderr
    assert run_cli("audit", env=remote).returncode == 0
    for command in (["audit", "--export"], ["audit", "--expect", f"1:{'00' * 32}"], ["audit", "--expect", "x"]):
        here, there = run_cli(*command, env=local), run_cli(*command, env=remote)
        assert (there.returncode, there.stdout, there.stderr) == (here.returncode, here.stdout, here.stderr), command


def test_a_submitter_is_refused_with_the_local_error_format(served: Served, run_cli):
    env = {"PRIVSCHED_SERVER": served.url, "PRIVSCHED_TOKEN": served.tokens["alice"]}
    refused = run_cli("dataset", "create", "x", "--epsilon", "1", "--delta", "1e-6", env=env)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: only an admin may create a dataset") and refused.stderr.count("\n") == 1
    assert run_cli("serve", env=env).stderr.startswith("error: `privsched serve` runs on the scheduler's machine")


def test_a_server_killed_mid_request_loses_and_duplicates_no_submission(served: Served):
    client = ps.connect(served.url, token=served.tokens["alice"])
    spec = {
        "name": "n",
        "dataset": "reviews",
        "blocks": ["b3"],
        "epsilon": 0.001,
        "job": {"function": "tests.service_jobs:spend_half"},
    }
    acknowledged: dict[str, int] = {}

    def submit_many() -> None:
        for i in range(400):
            try:
                acknowledged[f"s{i}"] = client.submit(spec, id=f"s{i}").id
            except RemoteError:
                return

    submitter = threading.Thread(target=submit_many)
    submitter.start()
    wait_until(lambda: len(acknowledged) >= 20)
    served.stop(signal.SIGKILL)
    submitter.join()
    assert 20 <= len(acknowledged) < 400
    served.start()
    again = ps.connect(served.url, token=served.tokens["alice"])
    resubmitted = {f"s{i}": again.submit(spec, id=f"s{i}").id for i in range(len(acknowledged) + 1)}
    assert {k: resubmitted[k] for k in acknowledged} == acknowledged
    with Ledger(served.db) as ledger:
        assert len(ledger.list_pipelines()) == len(resubmitted)  # one pipeline per id, none lost
        assert ledger.audit().ok


def test_a_submission_id_without_a_server_is_refused_and_writes_nothing(run_cli, tmp_path: Path):
    db = tmp_path / "p.db"
    make_database(db)
    before = dump_database(db)
    done = run_cli("submit", write(tmp_path, "a", "[b0]", 0.1), "--id", "x", env={"PRIVSCHED_DB": str(db)})
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "error: --id (an idempotent submission) needs --server or PRIVSCHED_SERVER\n"
    assert dump_database(db) == before


def test_a_serving_scheduler_warms_its_fork_server_before_any_job_and_says_so(served: Served):
    remote = ps.connect(served.url, token=served.tokens["vera"])
    local = ps.connect(served.db)
    said = {remote.scheduler_job_starts()}
    wait_until(lambda: said.add(remote.scheduler_job_starts()) or "warm" in said)
    assert said <= {None, "cold: the fork server is starting", "warm"}  # None: the API answers before the scheduler starts
    assert local.scheduler_job_starts() == "warm" and not local.list()  # no job has run: started with the scheduler
    served.stop()
    assert local.scheduler_job_starts() is None  # no scheduler serving: nothing to say
