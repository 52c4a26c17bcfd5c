"""``POST /v1/datasets/{name}/import``: an administrator uploads a table, which becomes blocks
in the server's block store as a local import makes them; nobody else may, and a block's row
count and fingerprint are shown to administrators only."""

from __future__ import annotations

from pathlib import Path

import pytest

import privsched as ps
from privsched import connect
from privsched.data.store import default_store
from privsched.remote import RemoteError
from tests.conftest import dump_database
from tests.server_fixtures import Server, server  # noqa: F401 -- the fixture
from tests.support.tables import event_rows, write_csv, write_parquet


@pytest.fixture
def events(server: Server) -> str:  # noqa: F811 -- the fixture
    with connect(server.db) as client:
        client.create_dataset("events", epsilon=10, delta=1e-7)
    return "events"


def test_an_admin_uploads_a_table_and_gets_its_blocks(server: Server, events: str, tmp_path: Path):  # noqa: F811
    client = ps.connect(server.url, token=server.tokens["admin"])
    table = write_parquet(tmp_path / "e.parquet", event_rows(2, 3))
    report = client.import_blocks(events, table, by="day", bounds={"amount": (0, 200)})
    assert [(b.key, b.rows) for b in report.added] == [("2026-10-01", 3), ("2026-10-02", 3)]
    assert all(Path(b.location).parent == default_store(server.db) for b in report.added)
    schema = client.dataset_schema(events)
    assert schema is not None and schema.bounds == {"amount": (0.0, 200.0)}
    with connect(server.db) as local:
        assert local.audit().ok
    assert not list(default_store(server.db).glob(".incoming-*"))


def test_a_submitter_may_not_upload_and_nothing_is_written(server: Server, events: str, tmp_path: Path):  # noqa: F811
    before = dump_database(server.db)
    client = ps.connect(server.url, token=server.tokens["alice"])
    with pytest.raises(RemoteError, match="only an admin may import blocks") as refused:
        client.import_blocks(events, write_csv(tmp_path / "e.csv", event_rows(1, 2)), by="day")
    assert refused.value.status == 403
    assert dump_database(server.db) == before


def test_an_upload_refused_for_bad_input_says_why_in_one_line(server: Server, events: str, tmp_path: Path):  # noqa: F811
    client = ps.connect(server.url, token=server.tokens["admin"])
    with pytest.raises(RemoteError, match="no column 'date' to key blocks by") as refused:
        client.import_blocks(events, write_csv(tmp_path / "e.csv", event_rows(1, 2)), by="date")
    assert refused.value.status == 400
    assert not [p for p in default_store(server.db).rglob("*") if p.is_file()]


def test_row_counts_and_fingerprints_are_shown_to_admins_only(server: Server, events: str, tmp_path: Path):  # noqa: F811
    ps.connect(server.url, token=server.tokens["admin"]).import_blocks(events, write_csv(tmp_path / "e.csv", event_rows(1, 5)), by="day")
    (seen_by_admin,) = ps.connect(server.url, token=server.tokens["admin"]).blocks(events)
    (seen_by_alice,) = ps.connect(server.url, token=server.tokens["alice"]).blocks(events)
    assert seen_by_admin.rows == 5 and seen_by_admin.sha256 is not None
    assert seen_by_alice.rows is None and seen_by_alice.sha256 is None


def test_an_admin_creates_a_user_unit_dataset_and_uploads_into_its_user_blocks(server: Server, tmp_path: Path):  # noqa: F811
    admin = ps.connect(server.url, token=server.tokens["admin"])
    admin.create_dataset("people", 10, 1e-7, unit="user", user_column="uid", max_rows_per_user=3)
    rows = [{"uid": f"p{u}", "amount": float(i)} for u in range(6) for i in range(2)]
    report = admin.import_blocks("people", write_parquet(tmp_path / "p.parquet", rows), partitions=2)
    seen = ps.connect(server.url, token=server.tokens["alice"]).dataset("people")
    assert (seen.unit, seen.user_column, seen.max_rows_per_user) == ("user", "uid", 3)
    assert {b.key for b in report.added} <= {"u0", "u1"} and sum(b.rows or 0 for b in report.added) == 12
    again = admin.import_blocks("people", write_parquet(tmp_path / "q.parquet", [{"uid": "p0", "amount": 9.0}]))
    assert again.added == [] and len(again.grown) == 1


def test_an_http_user_dataset_without_its_user_column_is_refused_and_nothing_is_written(server: Server):  # noqa: F811
    before = dump_database(server.db)
    with pytest.raises(RemoteError, match="--unit user needs --user-column") as refused:
        ps.connect(server.url, token=server.tokens["admin"]).create_dataset("people", 10, 1e-7, unit="user")
    assert refused.value.status == 400
    assert dump_database(server.db) == before
