"""The cost of the fenced lease: ledger grants per second with and without the fence.

A scheduler holding the lease checks, inside every write transaction, that the lease still
names it at its generation (one extra primary-key read; ``privsched/ledger/lease.py``). This
measures that cost on the scheduler's hottest write, a one-pipeline grant on 10 blocks
(``BEGIN IMMEDIATE``, WAL, ``synchronous=FULL``), against the same grants by an unfenced
ledger in the same process. Rounds alternate between the two; medians of wall rate and of
CPU time per grant are reported.

    .venv/bin/python benchmarks/fencing.py [--grants 300] [--rounds 3] [--dir PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from privsched.ledger import Ledger, PipelineRequest

BLOCKS_PER_GRANT = 10


def grant_rate(path: Path, grants: int, fenced: bool) -> tuple[float, float]:
    """(grants per second, CPU ms per grant) for one-pipeline grants."""
    with Ledger.init(path) as ledger:
        info = ledger.create_dataset("bench", 1e6, 1e-6, accounting="rdp")
        keys = [f"b{i}" for i in range(BLOCKS_PER_GRANT)]
        ledger.add_blocks("bench", keys, unlocked_fraction=1.0)
        ids = ledger.submit_many([PipelineRequest("p", "bench", keys, demand=info.capacity * 1e-6) for _ in range(grants)])
        if fenced:
            assert ledger.acquire_lease("bench", ttl=3600)
        wall, cpu = time.perf_counter(), time.process_time()
        for pipeline_id in ids:
            ledger.grant([pipeline_id])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return grants / wall, 1000 * cpu / grants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grants", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="folder for the database files (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for round_ in range(args.rounds):
            for fenced in (False, True) if round_ % 2 == 0 else (True, False):  # alternate who goes first
                results[fenced].append(grant_rate(Path(folder, f"{round_}-{fenced}.db"), args.grants, fenced))
    base_rate = statistics.median(r for r, _ in results[False])
    base_cpu = statistics.median(c for _, c in results[False])
    print("| ledger | grants | grants/s | CPU ms/grant | rate ratio | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for fenced in (False, True):
        rate = statistics.median(r for r, _ in results[fenced])
        cpu = statistics.median(c for _, c in results[fenced])
        name = "fenced (lease holder)" if fenced else "unfenced (baseline)"
        print(f"| {name} | {args.grants} | {rate:,.0f} | {cpu:.2f} | {rate / base_rate:.2f} | {cpu / base_cpu:.2f} |")


if __name__ == "__main__":
    main()
