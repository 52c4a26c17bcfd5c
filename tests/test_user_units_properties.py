"""Properties of user-unit datasets over random tables, imports and reads: no read holds more
than K rows of a person, no person is in two blocks of a ``user`` dataset, and changing one
person's rows, in any number of imports, changes at most one user block."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privsched import connect
from privsched.jobs.contribution import Contribution
from privsched.jobs.records import parquet_block, read_table
from tests.support.tables import write_parquet

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: A row: who (one of 8 people), which of 3 days, an amount.
rows_strategy = st.lists(
    st.fixed_dictionaries(
        {"uid": st.integers(0, 7), "day": st.sampled_from(["2026-10-01", "2026-10-02", "2026-10-03"]), "amount": st.integers(0, 5)}
    ),
    min_size=1,
    max_size=60,
)

#: Where a table is cut into successive imports, and how many user partitions.
cuts_strategy = st.lists(st.integers(0, 60), max_size=3)
partitions_strategy = st.integers(1, 5)


def imports_of(rows: list[dict], cuts: list[int]) -> list[list[dict]]:
    """``rows`` numbered (``n``: no two imports hold the same content, which would be refused)
    and split at ``cuts`` into the non-empty tables of successive imports."""
    rows = [{"uid": row["uid"], "day": row["day"], "amount": row["amount"], "n": n} for n, row in enumerate(rows)]
    bounds = sorted({c % (len(rows) + 1) for c in cuts} | {0, len(rows)})
    return [rows[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def import_all(folder: Path, unit: str, k: int, partitions: int, tables: list[list[dict]], db: Path | None = None) -> list:
    """A fresh database (or ``db``, created with the dataset) holding ``tables`` imported in order; its blocks."""
    db = db or folder / "p.db"
    with connect(db) as client:
        if not client.datasets():
            client.create_dataset("d", epsilon=10, delta=1e-7, unit=unit, user_column="uid", max_rows_per_user=k)
        for i, rows in enumerate(tables):
            options = {"by": "day", "every": "day"} if unit == "user-time" else {}
            client.import_blocks("d", write_parquet(folder / f"import{i}.parquet", rows), partitions=partitions, **options)
        return client.blocks("d")


@SETTINGS
@given(
    rows=rows_strategy,
    cuts=cuts_strategy,
    k=st.integers(1, 4),
    partitions=partitions_strategy,
    unit=st.sampled_from(["user", "user-time"]),
    read=st.sets(st.integers(0, 20)),
)
def test_no_read_holds_more_than_k_rows_of_a_person_and_no_person_is_in_two_user_blocks(
    rows: list[dict], cuts: list[int], k: int, partitions: int, unit: str, read: set[int]
):
    with tempfile.TemporaryDirectory() as name:
        blocks = import_all(Path(name), unit, k, partitions, imports_of(rows, cuts))
        bound = Contribution("uid", k)
        assert sum(b.rows for b in blocks) == len(rows)
        for block in blocks:
            people = Counter(parquet_block(block.location, bound=bound).column("uid").to_pylist())
            everyone = Counter(parquet_block(block.location).column("uid").to_pylist())
            assert people == {uid: min(k, count) for uid, count in everyone.items()}
        chosen = [b.location for i, b in enumerate(blocks) if i in read] or [blocks[0].location]
        held = Counter(read_table(chosen, bound=bound).column("uid").to_pylist())
        per_block = 1 if unit == "user" else len(chosen)  # user-time: a person's K rows per period
        assert max(held.values()) <= k * per_block
        if unit == "user":
            holders = Counter(uid for b in blocks for uid in set(parquet_block(b.location).column("uid").to_pylist()))
            assert set(holders.values()) == {1}


@SETTINGS
@given(
    rows=rows_strategy,
    cuts=cuts_strategy,
    partitions=partitions_strategy,
    person=st.integers(0, 7),
    replacement=st.lists(st.integers(0, 5), max_size=6),
)
def test_changing_one_persons_rows_in_every_import_changes_at_most_one_user_block(
    rows: list[dict], cuts: list[int], partitions: int, person: int, replacement: list[int]
):
    tables = imports_of(rows, cuts)
    # the person's rows changed in every import (amounts replaced, rows added or removed)
    changed = [
        [r for r in table if r["uid"] != person]
        + [{"uid": person, "day": "2026-10-01", "amount": a, "n": 100 * (i + 1) + j} for j, a in enumerate(replacement)]
        for i, table in enumerate(tables)
    ]
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "a").mkdir()
        (folder / "b").mkdir()
        with connect(folder / "a" / "p.db") as client:  # one database, copied: the same secret key
            client.create_dataset("d", epsilon=10, delta=1e-7, unit="user", user_column="uid", max_rows_per_user=2)
        shutil.copy(folder / "a" / "p.db", folder / "b" / "p.db")
        kept = [t for t in changed if t]
        original = {b.key: b.sha256 for b in import_all(folder / "a", "user", 2, partitions, tables, folder / "a" / "p.db")}
        other = {b.key: b.sha256 for b in import_all(folder / "b", "user", 2, partitions, kept, folder / "b" / "p.db")} if kept else {}
    different = {key for key in original.keys() | other.keys() if original.get(key) != other.get(key)}
    assert len(different) <= 1, different
