"""What a person's unit costs on the data side: an import into user blocks against the same
import into daily blocks, and a read of a user block bounded to K rows per person against
the same read unbounded.

A Parquet table of ``--rows`` rows (``--people`` people, about ``rows / people`` rows each,
over 30 days: user id, day, amount) is imported (:meth:`Client.import_blocks`) into a fresh
record-unit dataset ``--by day`` and into a fresh user-unit dataset with ``--partitions``
user blocks (one HMAC-SHA256 per distinct person, :mod:`privsched.data.people`). Then every
user block is read as a job reads it (:func:`privsched.jobs.records.read_table`) with the
dataset's bound of ``--k`` rows per person and without it, best of ``--reads``.

    .venv/bin/python benchmarks/user_units.py [--rows 1000000] [--people 100000] [--partitions 100] [--k 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def best(run: Callable[[], object], times: int) -> float:
    """The shortest of ``times`` runs, in seconds."""
    spans = []
    for _ in range(times):
        start = time.perf_counter()
        run()
        spans.append(time.perf_counter() - start)
    return min(spans)


def main() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from privsched import connect
    from privsched.jobs.contribution import Contribution
    from privsched.jobs.records import read_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--people", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--reads", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "uid": rng.integers(0, args.people, args.rows),
            "day": pa.array(np.datetime64("2026-10-01") + rng.integers(0, 30, args.rows).astype("timedelta64[D]")),
            "amount": rng.uniform(0, 200, args.rows),
        }
    )
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        pq.write_table(table, str(folder / "t.parquet"))
        with connect(folder / "p.db") as client:
            client.create_dataset("daily", epsilon=10, delta=1e-7)
            client.create_dataset("people", epsilon=10, delta=1e-7, unit="user", user_column="uid", max_rows_per_user=args.k)
            start = time.perf_counter()
            client.import_blocks("daily", folder / "t.parquet", by="day")
            record_s = time.perf_counter() - start
            start = time.perf_counter()
            client.import_blocks("people", folder / "t.parquet", partitions=args.partitions)
            user_s = time.perf_counter() - start
            blocks = [b.location for b in client.blocks("people")]
        bound = Contribution("uid", args.k)
        bounded_s = best(lambda: read_table(blocks, bound=bound), args.reads)
        plain_s = best(lambda: read_table(blocks), args.reads)
        kept = read_table(blocks, bound=bound).num_rows

    print(f"{args.rows:,} rows, {args.people:,} people, {args.partitions} user blocks, K = {args.k}")
    print("| step | seconds | rows/s | ratio |")
    print("|---|---|---|---|")
    print(f"| import into 30 daily blocks (record unit) | {record_s:.2f} | {args.rows / record_s:,.0f} | 1 |")
    print(f"| import into user blocks (user unit) | {user_s:.2f} | {args.rows / user_s:,.0f} | {user_s / record_s:.2f} |")
    print(f"| read every user block, unbounded | {plain_s:.2f} | {args.rows / plain_s:,.0f} | 1 |")
    ratio = bounded_s / plain_s
    print(f"| read every user block, K rows per person ({kept:,} kept) | {bounded_s:.2f} | {args.rows / bounded_s:,.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
