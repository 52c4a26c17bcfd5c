"""``blocks import``: a table becomes sealed Parquet blocks in the block store, one per value
(or period) of a column, registered in one transaction with their SHA-256 and row count."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from privsched import connect
from privsched.data.store import default_store
from privsched.ledger.schema import SCHEMA_VERSION
from tests.cli_inprocess import invoke
from tests.support.tables import event_rows, write_csv, write_jsonl, write_parquet


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "p.db"
    with connect(path) as client:
        client.create_dataset("events", epsilon=10, delta=1e-7)
    return path


def stored_files(db: Path) -> list[Path]:
    store = default_store(db)
    return sorted(store.rglob("*")) if store.exists() else []


def test_a_csv_becomes_one_block_per_day_keyed_by_the_date(db: Path, tmp_path: Path):
    table = write_csv(tmp_path / "events.csv", event_rows(days=3, per_day=5))
    outcome = invoke("blocks", "import", "events", table, "--by", "day", db=db)
    assert outcome.code == 0, outcome.stderr
    assert outcome.stdout.strip() == "imported 15 rows into 3 new block(s) of events"
    with connect(db) as client:
        blocks = client.blocks("events")
    assert [b.key for b in blocks] == ["2026-10-01", "2026-10-02", "2026-10-03"]
    assert [b.rows for b in blocks] == [5, 5, 5]
    for block in blocks:
        rows = pq.read_table(block.location).to_pylist()
        assert {str(r["day"]) for r in rows} == {block.key} and len(rows) == 5


def test_parquet_and_json_lines_import_like_csv(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.create_dataset("other", epsilon=10, delta=1e-7)
        a = client.import_blocks("events", write_parquet(tmp_path / "a.parquet", event_rows(2, 3)), by="day")
        b = client.import_blocks("other", write_jsonl(tmp_path / "b.jsonl", event_rows(2, 4)), by="day", every="day")
    assert [(x.key, x.rows) for x in a.added] == [("2026-10-01", 3), ("2026-10-02", 3)]
    assert [(x.key, x.rows) for x in b.added] == [("2026-10-01", 4), ("2026-10-02", 4)]


@pytest.mark.parametrize(("every", "keys"), [("week", ["2026-09-28", "2026-10-05"]), ("month", ["2026-09", "2026-10"])])
def test_every_week_or_month_groups_dates_by_period(db: Path, tmp_path: Path, every: str, keys: list[str]):
    import datetime

    rows = event_rows(days=9, per_day=2, first=datetime.date(2026, 9, 29))
    with connect(db) as client:
        report = client.import_blocks("events", write_csv(tmp_path / "e.csv", rows), by="day", every=every)
    assert [b.key for b in report.added] == keys
    assert sum(b.rows or 0 for b in report.added) == 18


def test_the_create_event_records_each_blocks_sha256_and_row_count(db: Path, tmp_path: Path):
    with connect(db) as client:
        (block,) = client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(1, 4)), by="day").added
    assert block.sha256 == hashlib.sha256(Path(block.location).read_bytes()).hexdigest()
    with sqlite3.connect(db) as conn:
        (detail,) = conn.execute("SELECT detail FROM events WHERE kind = 'create' AND block_id = ?", [block.id]).fetchone()
    assert json.loads(detail) == {"key": "2026-10-01", "location": block.location, "sha256": block.sha256, "rows": 4}


def test_the_block_store_is_private_and_its_files_are_written_once(db: Path, tmp_path: Path):
    with connect(db) as client:
        report = client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(2, 3)), by="day")
    store = default_store(db)
    assert store.stat().st_mode & 0o777 == 0o700
    assert len(list(store.glob("*.parquet"))) == 2
    assert {p.stat().st_mode & 0o777 for p in stored_files(db)} == {0o600}  # the blocks and the store's lock file
    assert sorted(Path(b.location).name for b in report.added) == sorted(f"{b.sha256}.parquet" for b in report.added)


def test_a_store_option_puts_the_blocks_elsewhere(db: Path, tmp_path: Path):
    table = write_csv(tmp_path / "e.csv", event_rows(1, 2))
    outcome = invoke("blocks", "import", "events", table, "--by", "day", "--store", tmp_path / "s", db=db)
    assert outcome.code == 0, outcome.stderr
    assert len(list((tmp_path / "s").glob("*.parquet"))) == 1 and not default_store(db).exists()


def test_a_file_that_grew_by_new_days_adds_only_the_new_days(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(2, 3)), by="day")
        report = client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(4, 3)), by="day")
        assert [b.key for b in report.added] == ["2026-10-03", "2026-10-04"]
        assert report.kept == ["2026-10-01", "2026-10-02"]
        assert len(client.blocks("events")) == 4


def test_the_first_import_records_the_schema_and_its_declarations(db: Path, tmp_path: Path):
    table = write_csv(tmp_path / "e.csv", event_rows(1, 2))
    outcome = invoke(
        "blocks", "import", "events", table, "--by", "day", "--bounds", "amount=0:200", "--categories", "country=A,B,C,D", db=db
    )
    assert outcome.code == 0, outcome.stderr
    with connect(db) as client:
        schema = client.dataset_schema("events")
    assert schema is not None
    assert schema.columns == {"day": "date32[day]", "amount": "double", "country": "string"}
    assert schema.bounds == {"amount": (0.0, 200.0)} and schema.categories == {"country": ["A", "B", "C", "D"]}


def test_a_statistic_without_bounds_takes_the_declared_ones(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(2, 2)), by="day", bounds={"amount": (0, 200)})
        spec = {
            "name": "m",
            "dataset": "events",
            "blocks": {"last": 2},
            "epsilon": 1.0,
            "job": {"kind": "statistic", "params": {"query": "mean", "column": "amount"}},
        }
        (request,) = client.requests([spec])
    assert request.job["params"]["bounds"] == [0.0, 200.0]


def test_the_audit_passes_after_imports(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(3, 2)), by="day", bounds={"amount": (0, 9)})
        report = client.audit()
    assert report.ok, report.violations


def test_an_audit_names_a_block_file_that_changed_or_went_missing(db: Path, tmp_path: Path):
    with connect(db) as client:
        first, second = client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(2, 2)), by="day").added
        Path(first.location).chmod(0o600)
        with open(first.location, "ab") as handle:
            handle.write(b"x")
        os.unlink(second.location)
        report = client.audit()
    assert not report.ok
    assert any(v.startswith("block events/2026-10-01: its data changed since it was registered") for v in report.violations)
    assert any(v.startswith("block events/2026-10-02: its data is missing") for v in report.violations)
    assert invoke("audit", db=db).code == 1


def test_an_audit_names_a_schema_row_edited_in_the_file(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(1, 2)), by="day", bounds={"amount": (0, 9)})
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE dataset_schemas SET definition = replace(definition, '9.0', '90.0')")
    with connect(db) as client:
        report = client.audit()
    assert any("its stored schema differs from the event log" in v for v in report.violations)


def test_dataset_schema_prints_columns_types_and_declarations(db: Path, tmp_path: Path):
    assert invoke("dataset", "schema", "events", db=db).stdout.startswith("dataset events has no schema yet")
    with connect(db) as client:
        client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(1, 2)), by="day", categories={"country": ["A", "B"]})
    shown = invoke("dataset", "schema", "events", db=db).stdout
    assert "amount" in shown and "double" in shown and "categories A,B" in shown


def test_an_older_database_is_upgraded_and_then_imports(tmp_path: Path):
    from tests.test_ledger_actors import V3_HEAD, restore_v3

    db = tmp_path / "old.db"
    restore_v3(db)
    with connect(db) as client:
        assert all(b.sha256 is None and b.rows is None for b in client.blocks())
        client.create_dataset("events", epsilon=10, delta=1e-7)
        client.import_blocks("events", write_csv(tmp_path / "e.csv", event_rows(2, 2)), by="day")
        report = client.audit(expect=V3_HEAD)
    assert report.ok, report.violations
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def test_two_imports_of_the_same_table_at_once_register_it_once_and_keep_its_files(db: Path, tmp_path: Path):
    import threading

    from privsched.errors import PrivschedError

    table = write_csv(tmp_path / "e.csv", event_rows(3, 200))
    with connect(db) as setup:
        setup.create_dataset("again", epsilon=10, delta=1e-7)
    start = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def import_into(dataset: str) -> None:
        with connect(db) as client:
            start.wait(timeout=60)
            try:
                client.import_blocks(dataset, table, by="day")
                outcomes[dataset] = "imported"
            except PrivschedError as exc:
                outcomes[dataset] = str(exc)

    threads = [threading.Thread(target=import_into, args=(name,)) for name in ("events", "again")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    (refusal,) = [text for text in outcomes.values() if text != "imported"]
    assert len(outcomes) == 2 and "the same records never get two budgets" in refusal, outcomes
    with connect(db) as client:
        assert len(client.blocks()) == 3
        report = client.audit()
    assert report.ok, report.violations
