"""A ledger on a read-only file system: every command and the Python API refuse it in one
line, with a non-zero exit and no traceback, and no byte of it changes (issue 12).

The file system is real: each command runs in its own user and mount namespaces, where the
ledger's folder is bound over itself and remounted read-only (``mount -o remount,bind,ro``);
outside, the folder stays writable, so the test reads the files back unchanged. Skipped
where unprivileged namespaces are not allowed.

A file system that turns read-only under a running ``serve`` is not tested: Linux refuses to
remount a file system read-only while a process holds a file on it open for writing (EBUSY),
as ``serve`` holds its database; only the kernel itself does so, after an I/O error."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from privsched import connect
from tests.conftest import REPO
from tests.support.blockdata import block_file
from tests.support.namespaces import UNSHARE, namespaces_allowed

pytestmark = pytest.mark.skipif(not namespaces_allowed(), reason="unprivileged user namespaces are not allowed")

#: Mounts ``$1`` read-only over itself, then runs the rest of the command line.
READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 90; shift; exec "$@"'
PIPELINE = {"name": "p", "dataset": "d", "blocks": ["b1"], "epsilon": 0.1,
            "job": {"kind": "statistic", "params": {"query": "count"}}}
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
    return subprocess.run([*UNSHARE, "sh", "-c", READ_ONLY, "sh", str(folder), *argv],
                          capture_output=True, text=True, env=env, cwd=folder.parent, timeout=120)


def privsched_on_read_only(folder: Path, db: Path, *args: str) -> subprocess.CompletedProcess:
    return on_read_only(folder, sys.executable, "-m", "privsched", *args, "--db", str(db))


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


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
    ["serve", "--until-idle", "--tick", "100ms"],
    ["list"],
    ["budget", "show", "d"],
    ["audit"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: " ".join(args[:2]))
def test_every_command_refuses_a_ledger_on_a_read_only_file_system_and_changes_no_byte(
        ledger: Path, tmp_path: Path, args: list[str]):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(PIPELINE))
    before = contents(ledger.parent)
    outcome = privsched_on_read_only(ledger.parent, ledger, *(a.format(spec=spec) for a in args))
    refused_in_one_line(outcome, f"{ledger.parent} is a read-only file system")
    assert contents(ledger.parent) == before


def test_blocks_add_with_a_data_location_refuses_the_read_only_ledger(ledger: Path, tmp_path: Path):
    before = contents(ledger.parent)
    outcome = privsched_on_read_only(ledger.parent, ledger, "blocks", "add", "d", "b2",
                                     "--location", f"b2={block_file(tmp_path, 'b2.npz')}")
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
    assert outcome.stdout == f"LedgerError cannot open {ledger}: {ledger.parent} is a read-only file system " \
                             "(the ledger writes its journal next to it)\n"
    assert contents(ledger.parent) == before


def test_a_database_file_mounted_read_only_in_a_writable_folder_is_named_as_such(ledger: Path):
    before = contents(ledger.parent)
    outcome = on_read_only(ledger, sys.executable, "-m", "privsched", "list", "--db", str(ledger))
    refused_in_one_line(outcome, "the file is on a read-only file system")
    assert contents(ledger.parent) == before
