"""Small tables written as CSV, Parquet or JSON Lines for import tests."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

FIRST_DAY = datetime.date(2026, 10, 1)


def event_rows(days: int, per_day: int, first: datetime.date = FIRST_DAY) -> list[dict]:
    """``per_day`` rows for each of ``days`` days: a day, an amount and a country."""
    return [
        {"day": (first + datetime.timedelta(days=d)).isoformat(), "amount": float((7 * d + 3 * i) % 250), "country": "ABCD"[i % 4]}
        for d in range(days)
        for i in range(per_day)
    ]


def write_csv(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a CSV file with a header line."""
    names = list(rows[0]) if rows else ["day", "amount", "country"]
    lines = [",".join(names)] + [",".join(str(row[n]) for n in names) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path
