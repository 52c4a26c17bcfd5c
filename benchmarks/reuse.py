"""Budget spent on a stream of repeated statistics, without and with exact reuse.

    .venv/bin/python benchmarks/reuse.py [--pool 200] [--stream 500] [--blocks 10] [--seed 1]

A pool of ``--pool`` distinct DP statistics (count, sum or mean of a bounded column, at one of
four ε, on a window of 2 to 4 consecutive sealed blocks) is drawn ``--stream`` times, uniformly
and Zipf-skewed (s = 1: the k-th query drawn with probability ∝ 1/k). Each stream is replayed
through :meth:`privsched.client.Client.submit` on a fresh ledger twice: with ``reuse: false``
(every query pays) and with reuse on (docs/privacy.md, "Reuse of released results"). A query
that is not reused is granted and completed through the ledger, consuming its whole demand,
as its job would; no data is read, since only the charges are measured. The ε spent is the
sum over blocks of the ε consumed (basic composition). The workload's own draws use a seeded
generator: they choose queries, not noise.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import privsched as ps  # noqa: E402

EPSILONS = (0.1, 0.2, 0.5, 1.0)
QUERIES = ({"query": "count"}, {"query": "sum", "column": "rating"}, {"query": "mean", "column": "rating"})
LOWER_BOUNDS = (0, 1, 2)


def query_pool(size: int, blocks: int, rng: np.random.Generator) -> list[dict]:
    """``size`` distinct statistic specs (module docstring)."""
    windows = [(start, width) for width in (2, 3, 4) for start in range(blocks - width + 1)]
    shapes = list(itertools.product(range(len(QUERIES)), LOWER_BOUNDS, EPSILONS, range(len(windows))))
    shapes = [s for s in shapes if QUERIES[s[0]]["query"] != "count" or s[1] == 0]  # a count has no bounds
    if size > len(shapes):
        raise SystemExit(f"error: --pool is at most {len(shapes)} with --blocks {blocks}")
    pool = []
    for q, low, epsilon, w in (shapes[i] for i in rng.choice(len(shapes), size, replace=False)):
        params = dict(QUERIES[q]) | ({} if QUERIES[q]["query"] == "count" else {"bounds": [low, 5]})
        start, width = windows[w]
        keys = [f"d{i:02d}" for i in range(start, start + width)]
        pool.append({"dataset": "reviews", "blocks": keys, "epsilon": epsilon, "job": {"kind": "statistic", "params": params}})
    return pool


def stream(size: int, length: int, skew: str, rng: np.random.Generator) -> list[int]:
    """Indices into the pool: uniform, or Zipf with s = 1 over ranks 1..size."""
    if skew == "uniform":
        return rng.integers(0, size, length).tolist()
    weights = 1.0 / np.arange(1, size + 1)
    return rng.choice(size, length, p=weights / weights.sum()).tolist()


def replay(pool: list[dict], order: list[int], blocks: int, reuse: bool) -> tuple[float, int, float]:
    """ε consumed over all blocks, queries that paid, and seconds, for one replay."""
    with tempfile.TemporaryDirectory() as folder, ps.connect(Path(folder) / "p.db") as client:
        client.create_dataset("reviews", epsilon=1e6, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", [f"d{i:02d}" for i in range(blocks)], unlocked=1.0)
        started, paid = time.perf_counter(), 0
        for n, i in enumerate(order):
            run = client.submit({"name": f"q{n}", **pool[i], "reuse": reuse})
            info = client.status(run.id)
            if info.state == "pending":
                client.ledger.grant([run.id])
                client.ledger.complete(run.id, {k: v for k, v in info.demands.items()})
                paid += 1
        spent = sum(float(b.consumed[0]) for b in client.blocks("reviews"))
        assert client.audit().ok
        return spent, paid, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, default=200, help="distinct statistics in the pool")
    parser.add_argument("--stream", type=int, default=500, help="queries in each stream")
    parser.add_argument("--blocks", type=int, default=10, help="sealed blocks (one a day)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload's draws")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    pool = query_pool(args.pool, args.blocks, rng)
    print(f"pool {args.pool} statistics, stream {args.stream} queries, {args.blocks} blocks")
    print("| stream | distinct | ε without reuse | ε with reuse | ratio | paid with reuse | seconds (without, with) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for skew in ("uniform", "zipf s=1"):
        order = stream(args.pool, args.stream, "uniform" if skew == "uniform" else "zipf", rng)
        without, _, t0 = replay(pool, order, args.blocks, reuse=False)
        with_reuse, paid, t1 = replay(pool, order, args.blocks, reuse=True)
        print(
            f"| {skew} | {len(set(order))} | {without:.1f} | {with_reuse:.1f} | {without / with_reuse:.2f}× | {paid} | {t0:.1f}, {t1:.1f} |"
        )


if __name__ == "__main__":
    main()
