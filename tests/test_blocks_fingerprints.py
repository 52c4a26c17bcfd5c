"""Fingerprints: ``blocks add`` records the SHA-256 of data privsched does not own, the same
data never gets two budgets, ``audit`` re-hashes every block's data; and an import puts
each row in exactly its key's block (a property over random tables)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privsched import connect
from tests.cli_inprocess import invoke
from tests.conftest import dump_database
from tests.support.tables import write_csv


def dataset_db(folder: Path) -> Path:
    db = folder / "p.db"
    with connect(db) as client:
        client.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
        client.create_dataset("e", epsilon=1.0, delta=1e-6, accounting="basic")
    return db


def test_blocks_add_records_the_sha256_of_a_file_it_does_not_own(tmp_path: Path):
    db = dataset_db(tmp_path)
    (tmp_path / "k1.bin").write_bytes(b"records")
    with connect(db) as client:
        (block,) = client.add_blocks("d", [("k1", str(tmp_path / "k1.bin"))])
    assert block.sha256 == hashlib.sha256(b"records").hexdigest() and block.rows is None


def test_the_same_file_under_a_second_key_or_dataset_is_refused_in_one_line(tmp_path: Path):
    db = dataset_db(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"records")
    (tmp_path / "copy.bin").write_bytes(b"records")
    assert invoke("blocks", "add", "d", "k1", "--location", f"k1={tmp_path / 'a.bin'}", db=db).code == 0
    before = dump_database(db)
    for args in (("d", "k2", "--location", f"k2={tmp_path / 'a.bin'}"), ("e", "k1", "--location", f"k1={tmp_path / 'copy.bin'}")):
        outcome = invoke("blocks", "add", *args, db=db)
        assert outcome.code == 1 and outcome.stderr.count("\n") == 1
        assert "is already registered as block 'k1' of dataset 'd'" in outcome.stderr
    assert dump_database(db) == before


def test_two_keys_of_one_request_with_the_same_data_are_refused(tmp_path: Path):
    db = dataset_db(tmp_path)
    (tmp_path / "a.bin").write_bytes(b"x")
    (tmp_path / "b.bin").write_bytes(b"x")
    locations = ["--location", f"k1={tmp_path / 'a.bin'}", "--location", f"k2={tmp_path / 'b.bin'}"]
    outcome = invoke("blocks", "add", "d", "k1", "k2", *locations, db=db)
    assert outcome.code == 1 and "blocks 'k1' and 'k2' hold the same data" in outcome.stderr


def test_empty_files_hold_no_records_and_may_be_added_twice(tmp_path: Path):
    db = dataset_db(tmp_path)
    (tmp_path / "a").touch()
    (tmp_path / "b").touch()
    with connect(db) as client:
        assert len(client.add_blocks("d", [("k1", str(tmp_path / "a")), ("k2", str(tmp_path / "b"))])) == 2


def test_the_audit_names_a_changed_file_in_a_folder_added_as_a_block(tmp_path: Path):
    db = dataset_db(tmp_path)
    folder = tmp_path / "day"
    folder.mkdir()
    (folder / "part-0").write_bytes(b"one")
    with connect(db) as client:
        client.add_blocks("d", [("k1", str(folder))])
        assert client.audit().ok
        (folder / "part-1").write_bytes(b"two")
        report = client.audit()
    assert [v for v in report.violations if v.startswith("block d/k1: its data changed since it was registered")]


def test_an_empty_block_file_may_go_away_but_may_not_gain_records(tmp_path: Path):
    db = dataset_db(tmp_path)
    (tmp_path / "a").touch()
    (tmp_path / "b").touch()
    with connect(db) as client:
        client.add_blocks("d", [("k1", str(tmp_path / "a")), ("k2", str(tmp_path / "b"))])
        (tmp_path / "a").unlink()
        (tmp_path / "b").write_bytes(b"records added later")
        report = client.audit()
    assert [v.split(":")[0] for v in report.violations] == ["block d/k2"]


keys = st.sampled_from(["north", "south", "east", "west", "k-1", "2026-10-01"])
rows = st.lists(st.tuples(keys, st.integers(-1000, 1000)), min_size=1, max_size=60)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=rows)
def test_every_row_lands_in_its_keys_block_in_file_order(tmp_path_factory, table: list[tuple[str, int]]):
    folder = tmp_path_factory.mktemp("import")
    db = dataset_db(folder)
    path = write_csv(folder / "t.csv", [{"region": key, "value": value, "order": i} for i, (key, value) in enumerate(table)])
    with connect(db) as client:
        report = client.import_blocks("d", path, by="region")
    assert sorted(b.key for b in report.added) == sorted({key for key, _ in table})
    for block in report.added:
        stored = [{**r, "region": str(r["region"])} for r in pq.read_table(block.location).to_pylist()]  # a date column reads as dates
        expected = [{"region": key, "value": value, "order": i} for i, (key, value) in enumerate(table) if key == block.key]
        assert stored == expected and block.rows == len(expected)
