"""Import throughput and block reads: ``blocks import`` against pyarrow doing the same work
itself, and a job's ``ctx.read`` against ``pyarrow.parquet`` reading the block directly.

1. A CSV of ``--rows`` rows over ``--days`` days (day, user id, amount, country, a note of
   about 60 characters: about 100 bytes a row, 1 GB at 10 million rows) is written once.
2. *pyarrow alone*: ``pyarrow.csv.read_csv`` of the whole file, then one Parquet file per
   day written with ``pyarrow.parquet.write_table`` (rows taken by a stable sort on the
   day): the least a tool must do to turn the CSV into daily Parquet files, holding the
   whole table in memory.
3. *privsched*: :meth:`Client.import_blocks` into a fresh database, ``--by day`` (streamed,
   spilled per day, each block written in fixed row groups, hashed, sealed and registered
   in one transaction).

Each of 2 and 3 runs in its own process, alternating for ``--rounds`` rounds; the table
gives the median rows per second, the ratio of the medians, and each process's peak
resident memory (``ru_maxrss``). Then a block of ``--block-rows`` rows is imported and read
whole by a job's context (:meth:`JobContext.read`, as an Arrow table) and by
``pyarrow.parquet.read_table`` on its path, best of ``--reads``.

    .venv/bin/python benchmarks/import.py [--rows 10000000] [--days 100] [--rounds 3] [--dir PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def write_csv(path: Path, rows: int, days: int, seed: int = 0) -> None:
    """The benchmark's CSV, written in chunks of a million rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(seed)
    first = np.datetime64("2026-01-01")
    note = np.array([f"note {i:03d} " + "x" * 50 for i in range(1000)])
    chunk = 1_000_000
    with pacsv.CSVWriter(str(path), pa.schema([("day", pa.date32()), ("user", pa.int64()), ("amount", pa.float64()),
                                               ("country", pa.string()), ("note", pa.string())])) as writer:  # fmt: skip
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            day = first + (np.arange(start, start + n) * days // rows).astype("timedelta64[D]")
            table = pa.table(
                {
                    "day": pa.array(day, pa.date32()),
                    "user": rng.integers(0, 1_000_000, n),
                    "amount": np.round(rng.gamma(2.0, 40.0, n), 2),
                    "country": pa.array(np.array(list("ABCD"))[rng.integers(0, 4, n)]),
                    "note": pa.array(note[rng.integers(0, 1000, n)]),
                }
            )
            writer.write_table(table)


def pyarrow_alone(csv: Path, out: Path) -> int:
    """Read the whole CSV, write one Parquet file per day; the rows read."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    table = pacsv.read_csv(str(csv))
    keys = pc.strftime(table.column("day"), format="%Y-%m-%d")
    encoded = pc.dictionary_encode(keys).combine_chunks()
    codes = encoded.indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    ordered = table.take(order)
    ends = np.cumsum(np.bincount(codes, minlength=len(encoded.dictionary)))
    start = 0
    for key, end in zip(encoded.dictionary.to_pylist(), ends.tolist()):
        pq.write_table(ordered.slice(start, end - start), str(out / f"{key}.parquet"))
        start = end
    return table.num_rows


def privsched_import(csv: Path, out: Path) -> int:
    """``blocks import`` into a fresh database in ``out``; the rows read."""
    from privsched import connect

    with connect(out / "p.db") as client:
        client.create_dataset("events", epsilon=10, delta=1e-7)
        return client.import_blocks("events", str(csv), by="day").rows


def phase(name: str, csv: Path, out: Path) -> dict:
    """Run one phase in this process (called in a child): rows, seconds, peak memory. The
    children are started by a parent that holds no table: Linux carries the peak resident
    memory across ``execve``, so a child's ``ru_maxrss`` is at least its parent's."""
    out.mkdir(parents=True)
    started = time.perf_counter()
    rows = {"pyarrow": pyarrow_alone, "privsched": privsched_import}[name](csv, out)
    seconds = time.perf_counter() - started
    return {"rows": rows, "seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_phase(name: str, csv: Path, out: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, __file__, "--phase", name, "--csv", str(csv), "--out", str(out), *extra], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def read_times(folder: Path, block_rows: int, reads: int) -> tuple[float, float]:
    """Seconds to read a ``block_rows``-row imported block whole: through a job's context,
    and with ``pyarrow.parquet.read_table`` (best of ``reads`` each, alternating)."""
    import numpy as np
    import pyarrow.parquet as pq

    from privsched import connect
    from privsched.budgets import Accounting
    from privsched.jobs.context import BlockGrant, JobContext

    csv = folder / "block.csv"
    write_csv(csv, block_rows, days=1, seed=1)
    with connect(folder / "read.db") as client:
        client.create_dataset("one", epsilon=10, delta=1e-7)
        (block,) = client.import_blocks("one", str(csv), by="day").added
    grant = {block.key: BlockGrant(block.key, block.location, np.zeros(2))}
    ctx = JobContext(1, "read", "one", Accounting.basic(), 1e-7, grant)
    through_ctx, direct = [], []
    for _ in range(reads):
        started = time.perf_counter()
        assert ctx.read().num_rows == block_rows
        through_ctx.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert pq.read_table(block.location).num_rows == block_rows
        direct.append(time.perf_counter() - started)
    return min(through_ctx), min(direct)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the CSV (10 million: about 1 GB)")
    parser.add_argument("--days", type=int, default=100, help="days the rows spread over (one block each)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two imports")
    parser.add_argument("--block-rows", type=int, default=1_000_000, help="rows of the block read by a job")
    parser.add_argument("--reads", type=int, default=5, help="reads of that block each way (best taken)")
    parser.add_argument("--dir", type=Path, default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--phase", choices=["csv", "pyarrow", "privsched", "read"], help=argparse.SUPPRESS)
    parser.add_argument("--csv", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "csv":
        write_csv(args.csv, args.rows, args.days)
        print(json.dumps({}))
    elif args.phase == "read":
        print(json.dumps(read_times(args.out, args.block_rows, args.reads)))
    elif args.phase is not None:
        print(json.dumps(phase(args.phase, args.csv, args.out)))
    else:
        compare(args)


def compare(args: argparse.Namespace) -> None:
    """Every phase in its own process; the tables."""
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        csv = folder / "events.csv"
        run_phase("csv", csv, folder, "--rows", str(args.rows), "--days", str(args.days))
        size = csv.stat().st_size
        runs: dict[str, list[dict]] = {"pyarrow": [], "privsched": []}
        for round_ in range(args.rounds):
            for name in runs:
                runs[name].append(run_phase(name, csv, folder / f"{name}-{round_}"))
        rate = {name: statistics.median(r["rows"] / r["seconds"] for r in found) for name, found in runs.items()}
        peak = {name: max(r["peak_mib"] for r in found) for name, found in runs.items()}
        ctx_s, direct_s = run_phase("read", csv, folder, "--block-rows", str(args.block_rows), "--reads", str(args.reads))
    print(f"CSV: {args.rows:,} rows over {args.days} days, {size / 1e6:,.0f} MB; {args.rounds} rounds, median")
    print("| import | rows/s | peak memory (MiB) |")
    print("|---|---:|---:|")
    for name, label in (("pyarrow", "pyarrow alone (read_csv, write_table per day)"), ("privsched", "privsched blocks import")):
        print(f"| {label} | {rate[name]:,.0f} | {peak[name]:,.0f} |")
    print(f"| ratio privsched / pyarrow | {rate['privsched'] / rate['pyarrow']:.2f} | |")
    print()
    print(f"| read a {args.block_rows:,}-row block | seconds (best of {args.reads}) |")
    print("|---|---:|")
    print(f"| pyarrow.parquet.read_table | {direct_s:.3f} |")
    print(f"| ctx.read() | {ctx_s:.3f} |")
    print(f"| ratio | {ctx_s / direct_s:.2f} |")


if __name__ == "__main__":
    main()
