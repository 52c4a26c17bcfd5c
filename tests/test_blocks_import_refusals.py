"""Bad input to ``blocks import``: one line, exit 1, nothing registered and no file left in
the block store (an import is one transaction: all blocks or none)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset  # noqa: F401 -- loaded before a test drops to a user who cannot read the environment
import pytest

from privsched import connect
from privsched.data import tables
from privsched.data.store import default_store
from tests.cli_inprocess import invoke
from tests.conftest import REPO, dump_database
from tests.support.tables import event_rows, write_csv, write_jsonl
from tests.support.unprivileged import as_owner, needs_a_restricted_user, owned_folder  # noqa: F401 -- a fixture


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "p.db"
    with connect(path) as client:
        client.create_dataset("events", epsilon=10, delta=1e-7)
        client.create_dataset("other", epsilon=10, delta=1e-7)
    return path


def store_content(db: Path) -> list[str]:
    store = default_store(db)
    return sorted(str(p.relative_to(store)) for p in store.rglob("*")) if store.exists() else []


def refused(db: Path, *args: object, reason: str) -> None:
    """``blocks import *args`` fails in one line containing ``reason``, changing nothing."""
    before, files = dump_database(db), store_content(db)
    outcome = invoke("blocks", "import", *args, db=db)
    assert outcome.code == 1, outcome.stdout
    assert outcome.stderr.count("\n") == 1 and outcome.stderr.startswith("error: "), outcome.stderr
    assert reason in outcome.stderr, outcome.stderr
    assert dump_database(db) == before
    assert store_content(db) == files


def test_a_missing_file_is_refused(db: Path, tmp_path: Path):
    refused(db, "events", tmp_path / "none.csv", "--by", "day", reason="no such file")


@needs_a_restricted_user
def test_a_file_privsched_cannot_read_is_refused(owned_folder: Path):
    db = owned_folder / "p.db"
    with connect(db) as client:
        client.create_dataset("events", epsilon=10, delta=1e-7)
    table = write_csv(owned_folder / "e.csv", event_rows(1, 2))
    table.chmod(0o200)
    before = dump_database(db)
    outcome = as_owner(owned_folder, lambda: invoke("blocks", "import", "events", table, "--by", "day", db=db))
    assert outcome.code == 1 and outcome.stderr == f"error: {table}: not readable\n"
    assert dump_database(db) == before and store_content(db) == []


def test_a_folder_given_as_a_file_is_refused(db: Path, tmp_path: Path):
    (tmp_path / "folder.csv").mkdir()
    refused(db, "events", tmp_path / "folder.csv", "--by", "day", reason="not a file")


def test_an_unknown_format_is_refused(db: Path, tmp_path: Path):
    (tmp_path / "e.txt").write_text("day\n2026-10-01\n")
    refused(db, "events", tmp_path / "e.txt", "--by", "day", reason="unknown format")


def test_a_file_that_is_not_what_its_name_says_is_refused(db: Path, tmp_path: Path):
    (tmp_path / "e.parquet").write_text("day,amount\n2026-10-01,1\n")
    refused(db, "events", tmp_path / "e.parquet", "--by", "day", reason="cannot be read as parquet")
    (tmp_path / "e.jsonl").write_text('{"day": "2026-10-01"}\n{"day": \n')
    refused(db, "events", tmp_path / "e.jsonl", "--by", "day", "--every", "day", reason="cannot be read")


def test_a_missing_by_column_is_refused_naming_the_columns(db: Path, tmp_path: Path):
    table = write_csv(tmp_path / "e.csv", event_rows(1, 2))
    refused(db, "events", table, "--by", "date", reason="no column 'date' to key blocks by (it has day, amount, country)")


def test_a_row_without_a_key_is_refused(db: Path, tmp_path: Path):
    (tmp_path / "e.csv").write_text("day,amount\n2026-10-01,1\n,2\n")
    refused(db, "events", tmp_path / "e.csv", "--by", "day", reason="has no value in a row")


def test_a_value_that_is_no_date_is_refused_with_every(db: Path, tmp_path: Path):
    (tmp_path / "e.csv").write_text("day,amount\n2026-10-01,1\nyesterday,2\n")
    refused(db, "events", tmp_path / "e.csv", "--by", "day", "--every", "day", reason="is not a date or time")


def test_an_unparsable_value_in_a_typed_column_is_refused(db: Path, tmp_path: Path):
    rows: list[dict] = [{"day": "2026-10-01", "amount": 1}] * 3 + [{"day": "2026-10-02", "amount": "lots"}]
    table = write_jsonl(tmp_path / "e.jsonl", rows)
    refused(db, "events", table, "--by", "day", "--every", "day", reason="cannot be read")


def test_a_key_that_is_not_a_valid_block_key_is_refused(db: Path, tmp_path: Path):
    (tmp_path / "e.csv").write_text("region,amount\nnorth,1\n   ,2\n")
    refused(db, "events", tmp_path / "e.csv", "--by", "region", reason="is not a valid block key")


def test_times_without_every_are_refused(db: Path, tmp_path: Path):
    (tmp_path / "e.csv").write_text("time,amount\n2026-10-01T10:00:00,1\n")
    refused(db, "events", tmp_path / "e.csv", "--by", "time", reason="give --every day, week or month")


def test_files_with_different_columns_are_refused(db: Path, tmp_path: Path):
    a = write_csv(tmp_path / "a.csv", event_rows(1, 2))
    b = write_csv(tmp_path / "b.csv", [{"day": "2026-10-05", "amount": 1.0}])
    refused(db, "events", a, b, "--by", "day", reason="its columns differ from")


def test_a_later_import_with_other_columns_than_the_dataset_is_refused(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("events", write_csv(tmp_path / "a.csv", event_rows(1, 2)), by="day")
    b = write_csv(tmp_path / "b.csv", [{"day": "2026-10-05", "amount": "x", "country": "A"}])
    refused(db, "events", b, "--by", "day", reason="column 'amount' is string, the dataset's is double")


def test_a_file_without_rows_is_refused(db: Path, tmp_path: Path):
    (tmp_path / "e.csv").write_text("day,amount\n")
    refused(db, "events", tmp_path / "e.csv", "--by", "day", reason="the file has no rows")


def test_a_file_that_changes_while_it_is_read_is_refused(db: Path, tmp_path: Path, monkeypatch):
    table = write_csv(tmp_path / "e.csv", event_rows(2, 3))
    read = tables.batches

    def appended_to_while_read(path, dataset):  # the writer of the file appends a row mid-read
        for i, batch in enumerate(read(path, dataset)):
            if i == 0:
                with open(path, "a") as handle:
                    handle.write("2026-10-09,1.0,A\n")
            yield batch

    monkeypatch.setattr(tables, "batches", appended_to_while_read)
    refused(db, "events", table, "--by", "day", reason="the file changed while it was read")


def test_data_already_registered_in_another_dataset_is_refused_naming_it(db: Path, tmp_path: Path):
    table = write_csv(tmp_path / "e.csv", event_rows(2, 3))
    assert invoke("blocks", "import", "events", table, "--by", "day", db=db).code == 0
    refused(db, "other", table, "--by", "day", reason="is already registered as block '2026-10-01' of dataset 'events'")


def test_other_rows_for_an_existing_key_are_refused(db: Path, tmp_path: Path):
    assert invoke("blocks", "import", "events", write_csv(tmp_path / "a.csv", event_rows(2, 3)), "--by", "day", db=db).code == 0
    refused(db, "events", write_csv(tmp_path / "b.csv", event_rows(3, 4)), "--by", "day", reason="already exists with other rows")


@pytest.mark.parametrize(
    ("declaration", "reason"),
    [
        (("--bounds", "amount=5:1"), "must be finite with LOW < HIGH"),
        (("--bounds", "amount=0"), "must be COLUMN=LOW:HIGH"),
        (("--bounds", "price=0:1"), "declared for column 'price', which the table does not have"),
        (("--bounds", "country=0:1"), "not a number"),
        (("--categories", "country=A,A"), "distinct non-empty values"),
        (("--categories", "country"), "must be COLUMN=A,B"),
    ],
)
def test_bad_declarations_are_refused(db: Path, tmp_path: Path, declaration: tuple[str, str], reason: str):
    refused(db, "events", write_csv(tmp_path / "e.csv", event_rows(1, 2)), "--by", "day", *declaration, reason=reason)


def test_an_unknown_dataset_is_refused(db: Path, tmp_path: Path):
    refused(db, "nope", write_csv(tmp_path / "e.csv", event_rows(1, 2)), "--by", "day", reason="nope")


def test_a_full_disk_mid_import_leaves_nothing(db: Path, tmp_path: Path):
    """A write that fails mid-import (here: the file size limit, as a full disk fails it)."""
    table = write_csv(tmp_path / "e.csv", event_rows(days=2, per_day=100_000))
    before = dump_database(db)
    limit = os.path.getsize(db) + (1 << 19)  # the ledger fits; a staged block (about 1.7 MB) does not

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run(
        [sys.executable, "-m", "privsched", "blocks", "import", "events", str(table), "--by", "day", "--db", str(db)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        preexec_fn=small_files,
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: cannot write the block store") and "too large" in done.stderr, done.stderr
    assert dump_database(db) == before
    assert store_content(db) == []
