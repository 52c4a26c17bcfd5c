"""Every ledger event records who caused it, covered by the hash chain; a ledger written
before actors were recorded is upgraded when opened and still verifies."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from privsched.ledger import Ledger, LedgerError, PipelineRequest
from privsched.ledger.identities import Identities
from privsched.ledger.models import OPERATOR, SCHEDULER
from privsched.ledger.schema import APPLICATION_ID, SCHEMA_VERSION

#: The SQL dump of a ledger written by schema version 3 (before actors: a dataset, two
#: blocks, a completed and a pending pipeline), and its chain head then.
V3_DUMP = Path(__file__).parent / "data" / "ledger-v3.sql"
V3_HEAD = "16:84e8c99831f253dc96bd59182b5eb13f47eebac907ab2a456812d20c537b898a"


def restore_v3(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(V3_DUMP.read_text())
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 3")
    conn.close()


def request(name: str = "p") -> PipelineRequest:
    return PipelineRequest(name, "stats", ["d1"], demand=np.array([0.1, 1e-7]))


def actors(ledger: Ledger, pipeline_id: int) -> list[tuple[str, str | None]]:
    return [(e.kind, e.actor) for e in ledger.events(pipeline_id=pipeline_id) if e.amount is None]


@pytest.fixture
def ledger(tmp_db: Path):
    with Ledger.init(tmp_db) as opened:
        opened.create_dataset("stats", 1.0, 1e-6, accounting="basic", now=0)
        opened.add_blocks("stats", ["d1"], unlocked_fraction=1.0, now=0)
        yield opened


def test_writes_through_the_file_are_recorded_as_the_operator(ledger: Ledger):
    pipeline = ledger.submit(request(), now=1)
    ledger.cancel(pipeline, now=2)
    assert {e.actor for e in ledger.events()} == {OPERATOR}


def test_an_explicit_actor_is_recorded_on_every_event_of_that_write(ledger: Ledger):
    pipeline = ledger.submit(request(), now=1, actor="ana")
    ledger.grant([pipeline], now=2)
    ledger.fail(pipeline, "crashed", now=3)
    ledger.release(pipeline, "operator error", now=4, actor="ana")
    assert actors(ledger, pipeline) == [("submit", "ana"), ("grant", OPERATOR), ("fail", OPERATOR), ("release", "ana")]
    release_moves = [e for e in ledger.events(pipeline_id=pipeline) if e.kind == "release"]
    assert release_moves and all(e.actor == "ana" for e in release_moves)


def test_submissions_in_one_transaction_record_each_their_own_actor(ledger: Ledger):
    ids = ledger.submit_many([request("a"), request("b")], now=1, actor=["ana", "bo"])
    assert [actors(ledger, i) for i in ids] == [[("submit", "ana")], [("submit", "bo")]]
    with pytest.raises(LedgerError, match="2 actors for 1 submissions"):
        ledger.submit_many([request()], actor=["ana", "bo"])


def test_the_lease_holder_writes_as_the_scheduler(ledger: Ledger, tmp_db: Path):
    pipeline = ledger.submit(request(), now=1)
    with Ledger(tmp_db) as scheduler:
        assert scheduler.acquire_lease("s1", 60.0)
        scheduler.grant([pipeline], now=2)
        scheduler.mark_running(pipeline, {"host": "here"}, now=3)
        scheduler.complete(pipeline, np.array([0.05, 1e-7]), now=4)
        scheduler.release_lease("s1")
        scheduler.unlock({1: 0.0}, now=5)
    assert actors(ledger, pipeline) == [("submit", OPERATOR), ("grant", SCHEDULER), ("run", SCHEDULER), ("complete", SCHEDULER)]


def test_an_actor_must_be_a_printable_name_and_a_refused_one_writes_nothing(ledger: Ledger):
    before = len(ledger.events())
    for bad in ("", "a\nb", "x" * 300):
        with pytest.raises(LedgerError, match="actor"):
            ledger.submit(request(), actor=bad)
    assert len(ledger.events()) == before


@pytest.mark.parametrize("name", [OPERATOR, SCHEDULER])
def test_the_operator_and_scheduler_names_are_not_user_names(ledger: Ledger, tmp_db: Path, name: str):
    with Identities(tmp_db) as identities, pytest.raises(LedgerError, match="reserved"):
        identities.add_user(name, "admin")


def test_a_changed_actor_breaks_the_chain(ledger: Ledger, tmp_db: Path):
    pipeline = ledger.submit(request(), now=1, actor="ana")
    event = ledger.events(pipeline_id=pipeline)[0].id
    conn = sqlite3.connect(tmp_db, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET actor = 'bo' WHERE id = ?", [event])
    conn.close()
    report = ledger.audit()
    assert f"event {event}: hash does not match" in "\n".join(report.violations)


def test_an_event_without_an_actor_after_one_with_is_reported(ledger: Ledger, tmp_db: Path):
    """An event forged in the older format (no actor) and linked correctly is still named."""
    from privsched.ledger import chain

    ledger.submit(request(), now=1)
    conn = sqlite3.connect(tmp_db, isolation_level=None)
    last_id, last_hash = conn.execute("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1").fetchone()
    row = (last_id + 1, 9.0, "expire", 1, None, 1, "cancelled", "timed_out", None, None, None, None)
    conn.execute(
        f"INSERT INTO events ({', '.join(chain.COLUMNS)}, hash) VALUES ({', '.join('?' * 13)})", [*row, chain.link(last_hash, row)]
    )
    conn.close()
    violations = "\n".join(ledger.audit().violations)
    assert f"event {last_id + 1}: records no actor" in violations


def test_a_ledger_of_schema_3_is_upgraded_keeps_its_history_and_records_actors_from_then_on(tmp_path: Path):
    path = tmp_path / "old.db"
    restore_v3(path)
    with Ledger(path) as ledger:
        report = ledger.audit(expect=V3_HEAD)
        assert report.ok and report.head == V3_HEAD, report.violations
        assert {e.actor for e in ledger.events()} == {None}
        pending = ledger.list_pipelines(["pending"])[0].id
        ledger.cancel(pending, actor="ana")
        assert actors(ledger, pending)[-1] == ("cancel", "ana")
        assert ledger.audit(expect=V3_HEAD).ok
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
