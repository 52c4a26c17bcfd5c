"""``blocks add`` (command line, Python API, HTTP API) refuses a data location that does not
exist or that privsched cannot read, in one line and writing nothing; a block may still be
added without a location (its data is not there yet), and the scheduler's preflight keeps
refusing to start a built-in job on it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from privsched import connect
from privsched.ledger import LedgerError
from tests.cli_inprocess import invoke
from tests.conftest import dump_database
from tests.server_fixtures import Server, server  # noqa: F401 -- the fixture
from tests.support.blockdata import block_file
from tests.support.unprivileged import as_owner, needs_a_restricted_user, owned_folder  # noqa: F401 -- a fixture


@pytest.fixture
def db(owned_folder: Path) -> Path:  # noqa: F811 -- the fixture
    path = owned_folder / "p.db"
    with connect(path) as client:
        client.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
    return path


def refused_in_one_line(db: Path, location: str, reason: str) -> None:
    before = dump_database(db)
    outcome = invoke("blocks", "add", "d", "k1", "k2", "--location", f"k2={location}", db=db)
    assert outcome.code == 1 and outcome.stderr.count("\n") == 1, outcome.stderr
    assert outcome.stderr.startswith("error: the data location of block 'k2'") and reason in outcome.stderr
    assert dump_database(db) == before


def test_a_location_that_does_not_exist_is_refused(db: Path, tmp_path: Path):
    refused_in_one_line(db, str(tmp_path / "missing.npz"), "does not exist")


def test_a_symbolic_link_loop_is_refused(db: Path, tmp_path: Path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    refused_in_one_line(db, str(tmp_path / "loop"), "cannot be used")


def test_a_fifo_is_refused_without_blocking(db: Path, tmp_path: Path):
    os.mkfifo(tmp_path / "fifo")
    refused_in_one_line(db, str(tmp_path / "fifo"), "neither a file nor a folder")


@needs_a_restricted_user
def test_a_file_privsched_cannot_read_is_refused(db: Path):
    secret = Path(block_file(db.parent, "secret.npz"))
    secret.chmod(0o200)
    as_owner(db.parent, lambda: refused_in_one_line(db, str(secret), "not readable"))


@needs_a_restricted_user
def test_a_folder_privsched_cannot_list_is_refused(db: Path):
    folder = db.parent / "closed"
    folder.mkdir(mode=0o600)
    as_owner(db.parent, lambda: refused_in_one_line(db, str(folder), "not readable"))


def test_files_and_folders_are_recorded_as_absolute_paths(db: Path, tmp_path: Path, monkeypatch):
    block_file(tmp_path, "k1.npz")
    monkeypatch.chdir(tmp_path)
    assert invoke("blocks", "add", "d", "k1", "k2", "--location", "k1=data/k1.npz", "--location", "k2=data", db=db).code == 0
    with connect(db) as client:
        assert {b.key: b.location for b in client.blocks("d")} == {"k1": str(tmp_path / "data/k1.npz"), "k2": str(tmp_path / "data")}


def test_a_block_without_a_location_is_still_added(db: Path):
    with connect(db) as client:
        (added,) = client.add_blocks("d", ["later"])
    assert added.location is None


def test_the_python_api_refuses_a_missing_location_and_writes_nothing(db: Path, tmp_path: Path):
    before = dump_database(db)
    with connect(db) as client, pytest.raises(LedgerError, match="does not exist"):
        client.add_blocks("d", [("k1", block_file(tmp_path, "k1")), ("k2", str(tmp_path / "nothing"))])
    assert dump_database(db) == before


def test_the_http_api_refuses_a_location_the_service_cannot_find_and_writes_nothing(server: Server, tmp_path: Path):
    before = dump_database(server.db)
    status, answer = server.call(
        "POST", "/v1/datasets/reviews/blocks", {"blocks": [{"key": "b9", "location": str(tmp_path / "nowhere.npz")}]}
    )
    assert status == 400 and "does not exist" in answer["error"] and "\n" not in answer["error"]
    assert dump_database(server.db) == before
    status, answer = server.call(
        "POST", "/v1/datasets/reviews/blocks", {"blocks": [{"key": "b9", "location": block_file(tmp_path, "b9.npz")}]}
    )
    assert status == 201, answer
