"""Listing many blocks: ``blocks list`` and ``budget show`` print the most recent blocks and a
summary line by default; ``--all`` prints every block (the baseline, as before paging).

Builds a database with ``--blocks`` blocks in one RDP dataset, then runs each command
through the real CLI entry point in this process, with and without ``--all``, and prints
wall seconds and output bytes with the ratio of the default to ``--all``.

    .venv/bin/python benchmarks/listing.py --blocks 100000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from privsched.ledger import BlockSpec, Ledger  # noqa: E402
from tests.cli_inprocess import invoke  # noqa: E402


def build(db: Path, blocks: int) -> None:
    with Ledger(db, create=True) as ledger:
        ledger.create_dataset("reviews", 10.0, 1e-7)
        for start in range(0, blocks, 10_000):
            ledger.add_blocks("reviews", [BlockSpec(f"day-{i:07d}") for i in range(start, min(blocks, start + 10_000))])


def measure(db: Path, *args: str) -> tuple[float, int]:
    started = time.perf_counter()
    outcome = invoke(*args, db=db)
    assert outcome.code == 0, outcome.stderr
    return time.perf_counter() - started, len(outcome.stdout.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=100_000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "listing.db"
        build(db, options.blocks)
        print("| command | blocks | default s | default bytes | --all s | --all bytes | time ratio | bytes ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for command in (["blocks", "list"], ["budget", "show"]):
            paged_s, paged_bytes = measure(db, *command)
            all_s, all_bytes = measure(db, *command, "--all")
            print(
                f"| {' '.join(command)} | {options.blocks:,} | {paged_s:.2f} | {paged_bytes:,} | {all_s:.2f} | "
                f"{all_bytes:,} | {paged_s / all_s:.3f} | {paged_bytes / all_bytes:.4f} |"
            )


if __name__ == "__main__":
    main()
