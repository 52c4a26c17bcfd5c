"""Datasets whose unit is a person: the unit fixed at creation and shown with the guarantee,
user blocks that hold each person once and grow by segments, and reads bounded to K rows of
each person before any job sees them."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from privsched import connect
from privsched.data.store import default_store
from privsched.jobs.contribution import Contribution
from privsched.jobs.records import parquet_block, read_table
from tests.cli_inprocess import invoke
from tests.support.tables import write_csv, write_parquet


def person_rows(people: int, per_person: int, day: str = "2026-10-01") -> list[dict]:
    """``per_person`` rows for each of ``people`` people, each row distinct."""
    return [{"uid": f"p{u}", "day": day, "amount": float(u * 100 + i)} for u in range(people) for i in range(per_person)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "p.db"
    with connect(path) as client:
        client.create_dataset("people", epsilon=10, delta=1e-7, unit="user", user_column="uid", max_rows_per_user=2)
    return path


def database_state(db: Path) -> tuple:
    with sqlite3.connect(db) as conn:
        return tuple(conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("datasets", "blocks", "events", "block_segments"))


def stored_files(db: Path) -> list[Path]:
    store = default_store(db)
    return sorted(p for p in store.rglob("*") if p.is_file() and p.name != ".lock") if store.exists() else []


# -- the unit -------------------------------------------------------------------------------------
def test_a_datasets_unit_is_recorded_by_its_create_event(db: Path):
    with connect(db) as client:
        info = client.dataset("people")
        created = next(e for e in client.events() if e.kind == "create" and e.block_id is None)
    assert (info.unit, info.user_column, info.max_rows_per_user) == ("user", "uid", 2)
    assert {k: json.loads(created.detail)[k] for k in ("unit", "user_column", "max_rows_per_user")} == {
        "unit": "user",
        "user_column": "uid",
        "max_rows_per_user": 2,
    }


def test_dataset_create_list_and_budget_show_state_the_unit(tmp_path: Path):
    db = tmp_path / "p.db"
    made = invoke("dataset", "create", "visits", "--epsilon", "10", "--delta", "1e-7", "--unit", "user-time", "--user-column", "uid", db=db)
    assert made.code == 0, made.stderr
    assert made.stdout.strip().endswith("unit user-time (uid, K=1)")
    assert "user-time (uid, K=1)" in invoke("dataset", "list", db=db).stdout
    assert "per user-time (uid, K=1)" in invoke("budget", "show", db=db).stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--unit", "user"], "error: --unit user needs --user-column"),
        (
            ["--unit", "user", "--user-column", "uid", "--max-rows-per-user", "0"],
            "error: --max-rows-per-user must be an integer of at least 1",
        ),
        (["--unit", "person"], "error: unit must be one of record, user, user-time"),
        (["--user-column", "uid"], "error: --user-column and --max-rows-per-user are for --unit user or user-time"),
    ],
)
def test_a_bad_unit_is_refused_in_one_line_and_creates_nothing(db: Path, options: list[str], message: str):
    before = database_state(db)
    outcome = invoke("dataset", "create", "other", "--epsilon", "10", "--delta", "1e-7", *options, db=db)
    assert outcome.code == 1
    assert outcome.stderr.startswith(message) and outcome.stderr.count("\n") == 1
    assert database_state(db) == before


# -- user blocks ----------------------------------------------------------------------------------
def test_a_user_import_places_every_person_in_one_of_p_blocks(db: Path, tmp_path: Path):
    outcome = invoke("blocks", "import", "people", write_csv(tmp_path / "a.csv", person_rows(40, 3)), "--partitions", "4", db=db)
    assert outcome.code == 0, outcome.stderr
    with connect(db) as client:
        blocks = client.blocks("people")
    assert {b.key for b in blocks} <= {"u0", "u1", "u2", "u3"} and sum(b.rows or 0 for b in blocks) == 120
    holders = Counter(uid for b in blocks for uid in set(parquet_block(b.location).column("uid").to_pylist()))
    assert len(holders) == 40 and set(holders.values()) == {1}


def test_a_persons_later_rows_grow_their_block_by_an_immutable_segment(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_rows(5, 2)), partitions=3)
        first = {b.key: b for b in client.blocks("people")}
        segments = {p: p.read_bytes() for p in stored_files(db)}
        report = client.import_blocks("people", write_csv(tmp_path / "b.csv", person_rows(5, 3, day="2026-10-02")))
        grown = {b.key: b for b in client.blocks("people")}
        audit = client.audit()
        events = [e for e in client.events() if e.kind == "grow"]
    assert report.added == [] and report.grown == sorted(first) and set(grown) == set(first)
    assert all(p.read_bytes() == content for p, content in segments.items())  # earlier segments untouched
    assert all(grown[k].rows == first[k].rows * 5 // 2 and grown[k].sha256 != first[k].sha256 for k in first)
    assert len(events) == len(first) and audit.ok, audit.violations
    for block in grown.values():
        days = Counter(str(d) for d in pq.read_table(sorted(Path(block.location).glob("*.parquet"))[-1]).column("day").to_pylist())
        assert set(days) == {"2026-10-02"}


def test_user_time_blocks_are_a_user_partition_in_one_period(tmp_path: Path):
    db = tmp_path / "p.db"
    rows = person_rows(10, 1, day="2026-10-01") + person_rows(10, 1, day="2026-10-02")
    with connect(db) as client:
        client.create_dataset("visits", epsilon=10, delta=1e-7, unit="user-time", user_column="uid")
        report = client.import_blocks("visits", write_csv(tmp_path / "a.csv", rows), by="day", every="day", partitions=2)
    assert {b.key.split(".")[0] for b in report.added} == {"2026-10-01", "2026-10-02"}
    assert {b.key.split(".")[1] for b in report.added} <= {"u0", "u1"}
    for block in report.added:
        assert {str(d) for d in parquet_block(block.location).column("day").to_pylist()} == {block.key.split(".")[0]}


def test_the_partition_count_is_fixed_at_the_first_import(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_rows(3, 1)), partitions=3)
    before, files = database_state(db), stored_files(db)
    outcome = invoke("blocks", "import", "people", write_csv(tmp_path / "b.csv", person_rows(4, 1)), "--partitions", "5", db=db)
    assert outcome.code == 1 and outcome.stderr.startswith("error: dataset 'people' has 3 user partitions, fixed at its first import")
    assert database_state(db) == before and stored_files(db) == files


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        ([{"who": "a", "amount": 1.0}], ["--partitions", "2"], "no user column 'uid'"),
        ([{"uid": "a", "amount": 1.0}, {"uid": None, "amount": 2.0}], ["--partitions", "2"], "the user column has no value in a row"),
        (person_rows(2, 1), [], "its first import needs --partitions P"),
        (person_rows(2, 1), ["--partitions", "2", "--by", "day"], "is a user-unit dataset: its blocks are user partitions"),
        (person_rows(2, 1), ["--partitions", "0"], "--partitions must be an integer from 1 to"),
    ],
)
def test_a_bad_user_import_is_refused_in_one_line_and_writes_nothing(
    db: Path, tmp_path: Path, rows: list[dict], options: list[str], message: str
):
    table = write_parquet(tmp_path / "a.parquet", rows)
    before = database_state(db)
    outcome = invoke("blocks", "import", "people", table, *options, db=db)
    assert outcome.code == 1
    assert message in outcome.stderr and outcome.stderr.startswith("error: ") and outcome.stderr.count("\n") == 1
    assert database_state(db) == before and stored_files(db) == []


def test_blocks_of_a_user_dataset_are_only_made_by_import(db: Path, tmp_path: Path):
    data = write_parquet(tmp_path / "a.parquet", person_rows(2, 1))
    outcome = invoke("blocks", "add", "people", "u0", "--location", f"u0={data}", db=db)
    assert outcome.code == 1 and "only `blocks import` makes its blocks" in outcome.stderr
    assert database_state(db)[1] == 0


def test_partitions_on_a_record_dataset_are_refused(tmp_path: Path):
    db = tmp_path / "p.db"
    with connect(db) as client:
        client.create_dataset("events", epsilon=10, delta=1e-7)
    outcome = invoke(
        "blocks", "import", "events", write_csv(tmp_path / "a.csv", person_rows(2, 1)), "--by", "day", "--partitions", "2", db=db
    )
    assert outcome.code == 1 and "--partitions is for user or user-time datasets" in outcome.stderr


def test_the_partition_key_is_in_no_event_and_no_api_answer(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_rows(3, 1)), partitions=2)
        key = client.ledger.user_key()
        shown = " ".join(f"{e.detail} {e.reason}" for e in client.events()) + repr(client.dataset("people")) + repr(client.blocks())
    assert len(key) == 32 and key.hex() not in shown


# -- reads ----------------------------------------------------------------------------------------
def test_a_read_keeps_each_persons_k_rows_of_smallest_row_hash_whatever_the_other_rows(tmp_path: Path):
    import pyarrow as pa

    from privsched.jobs.contribution import bound_rows, row_hashes

    rows = [{"uid": f"p{u}", "day": f"2026-10-0{1 + i % 3}", "amount": float((u * 7 + i * 13) % 10)} for u in range(3) for i in range(6)]
    alone = {f"p{u}": pa.Table.from_pylist([r for r in rows if r["uid"] == f"p{u}"]) for u in range(3)}
    kept = bound_rows(pa.Table.from_pylist(rows[::-1]), Contribution("uid", 2))
    assert Counter(kept.column("uid").to_pylist()) == {"p0": 2, "p1": 2, "p2": 2}
    for uid, own in alone.items():  # the person's rows of smallest hash, as if no one else were there
        smallest = own.take(pa.array(sorted(range(own.num_rows), key=lambda i: row_hashes(own)[i])[:2]))
        assert sorted(map(str, smallest.to_pylist())) == sorted(str(r) for r in kept.to_pylist() if r["uid"] == uid)


def granted_context(db: Path, tmp_path: Path):
    """A job's context granted the one user block of ``people`` (4 people, 5 rows each)."""
    import numpy as np

    from privsched.jobs.context import BlockGrant, JobContext

    with connect(db) as client:
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_rows(4, 5)), partitions=1)
        info = client.dataset("people")
        (block,) = client.blocks("people")
    return JobContext(
        pipeline_id=1,
        name="p",
        dataset="people",
        accounting=info.accounting,
        delta=1e-7,
        blocks={block.key: BlockGrant(block.key, block.location, np.zeros_like(info.capacity))},
        unit=info.unit,
        user_column=info.user_column,
        max_rows_per_user=info.max_rows_per_user,
    )


def test_a_jobs_context_carries_the_unit_and_bounds_ctx_read(db: Path, tmp_path: Path):
    from privsched.jobs.context import JobContext

    again = JobContext.from_json(granted_context(db, tmp_path).to_json())
    assert again.contribution == Contribution("uid", 2)
    assert Counter(again.read(columns=["uid"]).column("uid").to_pylist()) == {f"p{u}": 2 for u in range(4)}


def test_the_supervisors_block_descriptors_and_primitives_hold_at_most_k_rows_of_a_person(db: Path, tmp_path: Path):
    import os

    from privsched.jobs.primitives import Account

    ctx = granted_context(db, tmp_path)
    account = Account(ctx)
    names, fds = account.open_block(ctx.block_keys[0])
    assert names == [""] and len(fds) == 1
    with os.fdopen(fds[0], "rb") as passed:
        copied = pq.read_table(passed)
    assert Counter(copied.column("uid").to_pylist()) == {f"p{u}": 2 for u in range(4)}
    assert len(account._load()["uid"]) == 8  # what dp_count and the other primitives count


def test_an_npz_block_cannot_be_read_under_a_contribution_bound(tmp_path: Path):
    import numpy as np

    np.savez(tmp_path / "b.npz", uid=np.arange(3), amount=np.ones(3))
    with pytest.raises(ValueError, match="must be Parquet"):
        read_table([tmp_path / "b.npz"], bound=Contribution("uid", 1))


@pytest.mark.slow
def test_a_built_in_count_over_a_user_dataset_counts_at_most_k_rows_of_a_person(run_cli, db: Path, tmp_path: Path):
    with connect(db) as client:  # 40 people with 5 rows each, K = 2: 80 rows may be counted, not 200
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_rows(40, 5)), partitions=2, unlocked=1.0)
    spec = tmp_path / "count.yaml"
    spec.write_text("name: count\ndataset: people\nblocks: [u0, u1]\nepsilon: 5.0\njob: {kind: statistic, params: {query: count}}\n")
    env = {"PRIVSCHED_DB": str(db)}
    assert run_cli("submit", spec, env=env).returncode == 0
    served = run_cli("serve", "--until-idle", "--tick", "200ms", "--cpus", "1", "--gpus", "0", env=env)
    assert served.returncode == 0 and "pipeline 1 completed" in served.stdout + served.stderr, served.stderr
    metrics = json.loads((tmp_path / "runs" / "p" / "1" / "work" / "metrics.json").read_text())
    assert abs(metrics["value"] - 80) < 20  # Laplace noise of scale at most 2/5: 20 away has probability < e^-50


def test_a_later_import_through_another_store_still_grows_the_persons_block(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_rows(1, 2)), partitions=1)
        client.import_blocks("people", write_csv(tmp_path / "b.csv", person_rows(1, 1, day="2026-10-02")), store=tmp_path / "other")
        (block,) = client.blocks("people")
        assert client.audit().ok
    assert len(list(Path(block.location).glob("*.parquet"))) == 2 and block.rows == 3


def test_audit_names_a_user_block_whose_segment_list_was_changed(db: Path, tmp_path: Path):
    with connect(db) as client:
        client.import_blocks("people", write_csv(tmp_path / "a.csv", person_rows(2, 2)), partitions=1)
        client.import_blocks("people", write_csv(tmp_path / "b.csv", person_rows(2, 1, day="2026-10-02")))
        assert client.audit().ok
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM block_segments WHERE name LIKE '000001-%'")
    with connect(db) as client:
        report = client.audit()
    assert not report.ok
    assert any("segments' rows do not add up" in v for v in report.violations)
    assert any("does not hold exactly its registered segments" in v for v in report.violations)
