"""Ledger throughput: grants per second through the ledger API against raw ``sqlite3``.

Each grant allocates one pipeline's demand on 10 blocks, as one ``BEGIN IMMEDIATE``
transaction with ``synchronous=FULL`` in WAL mode. The raw baseline does the same row work
in the same process with plain ``sqlite3``: read the 10 balance rows, subtract the demand,
write them back, mark the pipeline granted, commit. The ledger additionally checks the fit
under the dataset's accounting and appends one event per block and per pipeline, each
carrying its SHA-256 link in the event log's hash chain (``privsched/ledger/chain.py``).
Measurements alternate between the two for several rounds; the median rate is reported,
and the ratio is the median of each round's ledger/raw ratio (the two runs of a round are
back to back, so a change in the machine's load hits both). The CPU-time ratio compares the
process CPU time per grant, which disk syncs and other processes barely affect.

    .venv/bin/python benchmarks/ledger.py [--grants 500] [--rounds 3] [--dir PATH]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from privsched.ledger import Ledger, PipelineRequest

BLOCKS_PER_GRANT = 10
ORDERS_12 = (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 16.0, 32.0, 64.0)


def ledger_rate(path: Path, accounting: str, grants: int, batch: int) -> tuple[float, float]:
    """Grants per second through :meth:`Ledger.grant`, ``batch`` pipelines per call, in
    wall-clock and in process CPU time."""
    with Ledger.init(path) as ledger:
        info = ledger.create_dataset("bench", 1e6, 1e-6, accounting=accounting, alphas=ORDERS_12 if accounting == "rdp" else None)
        keys = [f"b{i}" for i in range(BLOCKS_PER_GRANT)]
        ledger.add_blocks("bench", keys, unlocked_fraction=1.0)
        demand = info.capacity * 1e-6
        ids = ledger.submit_many([PipelineRequest("p", "bench", keys, demand=demand) for _ in range(grants)])
        start, cpu = time.perf_counter(), time.process_time()
        for i in range(0, grants, batch):
            ledger.grant(ids[i : i + batch])
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert len(ledger.list_pipelines(["granted"])) == grants
    return grants / elapsed, grants / cpu


def raw_rate(path: Path, dims: int, grants: int) -> tuple[float, float]:
    """Transactions per second of plain sqlite3 doing the same balance-row updates, in
    wall-clock and in process CPU time."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE balances (block_id INTEGER PRIMARY KEY, unlocked BLOB, allocated BLOB)")
    conn.execute("CREATE TABLE pipelines (id INTEGER PRIMARY KEY, state TEXT)")
    full = np.full(dims, 1e6).tobytes()
    zero = np.zeros(dims).tobytes()
    conn.executemany("INSERT INTO balances VALUES (?, ?, ?)", [(b, full, zero) for b in range(BLOCKS_PER_GRANT)])
    conn.executemany("INSERT INTO pipelines VALUES (?, 'pending')", [(p,) for p in range(grants)])
    demand = np.full(dims, 1e-3)
    start, cpu = time.perf_counter(), time.process_time()
    for pipeline in range(grants):
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute("SELECT block_id, unlocked, allocated FROM balances").fetchall()
        conn.executemany(
            "UPDATE balances SET unlocked = ?, allocated = ? WHERE block_id = ?",
            [((np.frombuffer(u) - demand).tobytes(), (np.frombuffer(a) + demand).tobytes(), b) for b, u, a in rows],
        )
        conn.execute("UPDATE pipelines SET state = 'granted' WHERE id = ?", [pipeline])
        conn.execute("COMMIT")
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    conn.close()
    return grants / elapsed, grants / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grants", type=int, default=500, help="grants per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds (median kept)")
    parser.add_argument("--batch", type=int, default=50, help="pipelines per grant call in the batched column")
    parser.add_argument("--dir", type=Path, default=None, help="where the database files go (default: temp dir)")
    args = parser.parse_args()

    print(
        f"| accounting | K | grants | raw sqlite3 txn/s | ledger grants/s | ratio | CPU-time ratio "
        f"| ledger grants/s, {args.batch} per call |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for accounting, dims in (("basic", 2), ("rdp", len(ORDERS_12))):
        raw, single, batched = [], [], []
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            for round_ in range(args.rounds):
                base = Path(tmp) / f"{accounting}-{round_}"
                raw.append(raw_rate(base.with_suffix(".raw.db"), dims, args.grants))
                single.append(ledger_rate(base.with_suffix(".ledger.db"), accounting, args.grants, 1))
                batched.append(ledger_rate(base.with_suffix(".batch.db"), accounting, args.grants, args.batch))
        r, s, b = (statistics.median(wall for wall, _ in x) for x in (raw, single, batched))
        ratio = statistics.median(ledger[0] / raw_[0] for ledger, raw_ in zip(single, raw))
        cpu_ratio = statistics.median(ledger[1] / raw_[1] for ledger, raw_ in zip(single, raw))
        print(f"| {accounting} | {dims} | {args.grants} | {r:,.0f} | {s:,.0f} | {ratio:.2f} | {cpu_ratio:.2f} | {b:,.0f} |")


if __name__ == "__main__":
    main()
