"""A ledger on a read-only file system: every command and the Python API refuse it in one
line, with a non-zero exit and no traceback, and no byte of it changes (issue 12).

The file system is real: each command runs in its own user and mount namespaces, where the
ledger's folder is bound over itself and remounted read-only (``mount -o remount,bind,ro``);
outside, the folder stays writable, so the test reads the files back unchanged. Skipped
where unprivileged namespaces are not allowed.

Under a running ``serve``, the ledger's folder is mounted read-only over itself once the
scheduler has opened its database: every file the scheduler opens from then on (a job's run
folder) is refused with EROFS, and ``serve`` waits it out as it waits out a full disk,
without charging the job, until the folder is writable again. (Linux refuses to remount a
file system read-only while a file on it is open for writing, as the database is: only the
kernel itself does so, after an I/O error, so writes to the open database are not refused.)"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from privsched import connect
from tests.conftest import REPO
from tests.support.blockdata import block_file
from tests.support.namespaces import UNSHARE, namespaces_allowed

pytestmark = pytest.mark.skipif(not namespaces_allowed(), reason="unprivileged user namespaces are not allowed")

#: Mounts ``$1`` read-only over itself, then runs the rest of the command line.
READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 90; shift; exec "$@"'
PIPELINE = {"name": "p", "dataset": "d", "blocks": ["b1"], "epsilon": 0.1, "job": {"kind": "statistic", "params": {"query": "count"}}}
API = """
import sys
from privsched import connect
from privsched.errors import PrivschedError
try:
    getattr(connect(sys.argv[1]), sys.argv[2])()
except PrivschedError as exc:
    print(type(exc).__name__, exc)
"""


def on_read_only(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    """Run ``argv`` where ``folder`` is a read-only file system."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PRIVSCHED_DB", None)
    return subprocess.run(
        [*UNSHARE, "sh", "-c", READ_ONLY, "sh", str(folder), *argv], capture_output=True, text=True, env=env, cwd=folder.parent
    )


def privsched_on_read_only(folder: Path, db: Path, *args: str) -> subprocess.CompletedProcess:
    return on_read_only(folder, sys.executable, "-m", "privsched", *args, "--db", str(db))


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused_in_one_line(outcome: subprocess.CompletedProcess, reason: str) -> None:
    assert outcome.returncode == 1 and outcome.stdout == "", outcome
    assert outcome.stderr.startswith("error: ") and outcome.stderr.count("\n") == 1, outcome.stderr
    assert reason in outcome.stderr and "Traceback" not in outcome.stderr, outcome.stderr


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """A database with a dataset of one block (and a pending pipeline), alone in its folder."""
    (tmp_path / "ledger").mkdir()
    db = tmp_path / "ledger" / "p.db"
    with connect(db) as client:
        client.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("d", ["b1"])
        client.submit(PIPELINE)
    return db


COMMANDS = [
    ["init"],
    ["dataset", "create", "e", "--epsilon", "1", "--delta", "1e-6"],
    ["blocks", "add", "d", "b2"],
    ["submit", "{spec}"],
    ["cancel", "1"],
    ["serve", "--policy", "fcfs", "--until-idle", "--tick", "100ms"],
    ["serve", "--policy", "fcfs", "--until-idle", "--tick", "100ms", "--listen", "127.0.0.1:0"],
    ["user", "add", "alice", "--role", "submitter"],
    ["list"],
    ["status", "1"],
    ["budget", "show", "d"],
    ["audit"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: " ".join(args))
def test_every_command_refuses_a_ledger_on_a_read_only_file_system_and_changes_no_byte(ledger: Path, tmp_path: Path, args: list[str]):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(PIPELINE))
    before = contents(ledger.parent)
    outcome = privsched_on_read_only(ledger.parent, ledger, *(a.format(spec=spec) for a in args))
    refused_in_one_line(outcome, f"{ledger.parent} is a read-only file system")
    assert contents(ledger.parent) == before


def test_blocks_add_with_a_data_location_refuses_the_read_only_ledger(ledger: Path, tmp_path: Path):
    before = contents(ledger.parent)
    outcome = privsched_on_read_only(
        ledger.parent, ledger, "blocks", "add", "d", "b2", "--location", f"b2={block_file(tmp_path, 'b2.npz')}"
    )
    refused_in_one_line(outcome, "read-only file system")
    assert contents(ledger.parent) == before


def test_init_on_an_empty_read_only_file_system_creates_nothing(tmp_path: Path):
    folder = tmp_path / "ledger"
    folder.mkdir()
    refused_in_one_line(privsched_on_read_only(folder, folder / "new.db", "init"), "read-only file system")
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("method", ["init", "datasets", "list"])
def test_the_python_api_raises_a_one_line_error_on_a_read_only_file_system(ledger: Path, method: str):
    before = contents(ledger.parent)
    outcome = on_read_only(ledger.parent, sys.executable, "-c", API, str(ledger), method)
    assert outcome.returncode == 0 and outcome.stderr == "", outcome
    assert (
        outcome.stdout == f"LedgerError cannot open {ledger}: {ledger.parent} is a read-only file system "
        "(the ledger writes its journal next to it)\n"
    )
    assert contents(ledger.parent) == before


def test_a_database_file_mounted_read_only_in_a_writable_folder_is_named_as_such(ledger: Path):
    before = contents(ledger.parent)
    outcome = on_read_only(ledger, sys.executable, "-m", "privsched", "list", "--db", str(ledger))
    refused_in_one_line(outcome, "the file is on a read-only file system")
    assert contents(ledger.parent) == before


#: Runs ``serve`` on ``$1/p.db``; mounts ``$1`` read-only once ``$2/ro`` exists, writable
#: again once ``$2/rw`` exists, and stops ``serve`` (SIGTERM) once ``$2/stop`` exists (at
#: any step).
SERVE_THEN_READ_ONLY = """
ledger=$1 signals=$2
until_exists() { while [ ! -e "$signals/$1" ] && [ ! -e "$signals/stop" ]; do sleep 0.05; done; }
"$3" -m privsched serve --policy fcfs --tick 100ms --cpus 1 --listen 127.0.0.1:0 --db "$ledger/p.db" > "$signals/serve.log" 2>&1 &
scheduler=$!
until_exists ro; mount --bind "$ledger" "$ledger" && mount -o remount,bind,ro "$ledger" && touch "$signals/mounted"
until_exists rw; umount "$ledger"
until_exists stop; kill -TERM $scheduler; wait $scheduler
"""


def eventually(condition: Callable[[], bool], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def test_serve_waits_out_a_folder_turned_read_only_and_starts_the_job_once_it_is_writable(tmp_path: Path):
    folder, signals = tmp_path / "ledger", tmp_path / "signals"
    folder.mkdir()
    signals.mkdir()
    np.savez(tmp_path / "b1.npz", rating=np.linspace(0, 5, 40))
    with connect(folder / "p.db") as client:
        client.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("d", [("b1", str(tmp_path / "b1.npz"))])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    scheduler = subprocess.Popen(
        [*UNSHARE, "sh", "-c", SERVE_THEN_READ_ONLY, "sh", str(folder), str(signals), sys.executable], env=env, cwd=tmp_path
    )
    log = signals / "serve.log"
    try:
        with connect(folder / "p.db") as client:  # outside the namespace the folder is always writable
            first = client.submit(PIPELINE).id  # once it has run, the scheduler's loop is under way
            eventually(
                lambda: client.status(first).state == "completed", lambda: log.read_text() if log.exists() else "serve wrote nothing"
            )
            (signals / "ro").touch()
            eventually((signals / "mounted").exists, lambda: "the folder was never mounted read-only")
            pipeline = client.submit(PIPELINE).id
            eventually(lambda: "storage read-only since" in log.read_text(), log.read_text)
            waiting = client.status(pipeline)
            assert waiting.state == "granted" and waiting.consumed is None, log.read_text()  # not started, not charged
            (signals / "rw").touch()
            eventually(lambda: client.status(pipeline).state == "completed", log.read_text)
            assert "storage available again" in log.read_text()
            assert client.audit().ok
    finally:
        (signals / "stop").touch()
        scheduler.wait()
    assert scheduler.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()
