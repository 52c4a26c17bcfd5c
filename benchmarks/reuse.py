"""Budget spent on a stream of repeated statistics, without and with exact reuse, and on a
stream of linear queries with the histogram cache.

    .venv/bin/python benchmarks/reuse.py [--pool 200] [--stream 500] [--blocks 10] [--seed 1] [--rows 1000]

A pool of ``--pool`` distinct DP statistics (count, sum or mean of a bounded column, at one of
four ε, on a window of 2 to 4 consecutive sealed blocks) is drawn ``--stream`` times, uniformly
and Zipf-skewed (s = 1: the k-th query drawn with probability ∝ 1/k). Each stream is replayed
through :meth:`privsched.client.Client.submit` on a fresh ledger twice: with ``reuse: false``
(every query pays) and with reuse on (docs/privacy.md, "Reuse of released results"). A query
that is not reused is granted and completed through the ledger, consuming its whole demand,
as its job would; no data is read, since only the charges are measured. The ε spent is the
sum over blocks of the ε consumed (basic composition). The workload's own draws use a seeded
generator: they choose queries, not noise.

Linear queries (docs/privacy.md, "Answers from a cached histogram"): a pool of ``--pool``
distinct counts and histograms (2, 4 or 8 bins of the ratings over [1, 5]) on a window of 2 to
4 blocks, each asking an accuracy (α ∈ {50, 100, 200}, β ∈ {0.01, 0.05}) instead of an ε, is
drawn in the same two ways and replayed three times: without reuse, with exact reuse only,
and with the cache. Each request is built by :meth:`~privsched.client.Client.requests` and
looked up by :func:`privsched.service.reuse.with_reuse`, as ``submit`` does; a query that
pays is granted and completed through the ledger, and its release is made in this process
by :func:`privsched.statistics.release.dp_statistic` (OpenDP's noise, from OS entropy) on
``--rows`` synthetic reviews a block, in place of the job's run. Every answer, paid or from
the cache, is compared with the true answer: a miss is a bin off by more than its α.
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


LINEAR = ({"query": "count"}, *({"query": "histogram", "column": "rating", "bounds": [1, 5], "bins": b} for b in (2, 4, 8)))
ACCURACIES = tuple({"alpha": a, "beta": b} for a in (50.0, 100.0, 200.0) for b in (0.01, 0.05))


def linear_pool(size: int, blocks: int, rng: np.random.Generator) -> list[dict]:
    """``size`` distinct linear query specs with an accuracy (module docstring)."""
    windows = [(start, width) for width in (2, 3, 4) for start in range(blocks - width + 1)]
    shapes = list(itertools.product(range(len(LINEAR)), range(len(ACCURACIES)), range(len(windows))))
    if size > len(shapes):
        raise SystemExit(f"error: --pool is at most {len(shapes)} with --blocks {blocks}")
    pool = []
    for q, a, w in (shapes[i] for i in rng.choice(len(shapes), size, replace=False)):
        start, width = windows[w]
        keys = [f"d{i:02d}" for i in range(start, start + width)]
        job = {"kind": "statistic", "params": LINEAR[q]}
        pool.append({"dataset": "reviews", "blocks": keys, "accuracy": ACCURACIES[a], "job": job})
    return pool


def replay_linear(pool: list[dict], order: list[int], ratings: list[np.ndarray], mode: str) -> tuple[float, int, int, float]:
    """ε consumed over all blocks, queries that paid, answers off by more than their α, and
    the sum of the β of all answers (the expected misses at most), for one replay in
    ``mode`` (without, exact or cache)."""
    from privsched.budgets.mechanisms import parse_mechanism
    from privsched.service.cache import combined_answer
    from privsched.service.reuse import with_reuse
    from privsched.statistics.queries import StatisticJob
    from privsched.statistics.release import dp_statistic

    released: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as folder, ps.connect(Path(folder) / "p.db") as client:
        client.create_dataset("reviews", epsilon=1e6, delta=1e-6, accounting="basic")
        client.add_blocks("reviews", [f"d{i:02d}" for i in range(len(ratings))], unlocked=1.0)
        paid = misses = 0
        expected = 0.0
        for n, i in enumerate(order):
            request = client.requests([{"name": f"q{n}", **pool[i], "reuse": False}])[0]
            if mode != "without":
                request = with_reuse(client.ledger, request, released.get if mode == "cache" else None)
            run = client.ledger.submit(request)
            info = client.status(run)
            job = StatisticJob.model_validate(pool[i]["job"]["params"])
            values = np.concatenate([ratings[int(k[1:])] for k in info.block_keys]).astype(float)
            if info.state == "pending":
                client.ledger.grant([run])
                client.ledger.complete(run, dict(info.demands))
                released[run] = dp_statistic(job, parse_mechanism(info.mechanism), values, len(values))
                paid += 1
            answer = client.result(run).metrics if run not in released else released[run]
            if "reused_from" in info.job:
                answer = released[info.job["reused_from"]]
            if "cache_update" in info.job:
                answer = combined_answer(client.ledger, client.status(run), released.get) or {}
            truth = [len(values)] if job.query == "count" else np.histogram(values, bins=job.bins, range=job.bounds)[0]
            value = np.atleast_1d(np.asarray(answer["value"], dtype=float))
            misses += bool(np.any(np.abs(value - truth) > pool[i]["accuracy"]["alpha"]))
            expected += pool[i]["accuracy"]["beta"]
        spent = sum(float(b.consumed[0]) for b in client.blocks("reviews"))
        assert client.audit().ok
        return spent, paid, misses, expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pool", type=int, default=200, help="distinct statistics in the pool")
    parser.add_argument("--stream", type=int, default=500, help="queries in each stream")
    parser.add_argument("--blocks", type=int, default=10, help="sealed blocks (one a day)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload's draws")
    parser.add_argument("--rows", type=int, default=1000, help="synthetic reviews a block (linear queries)")
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
    linear_queries(args, rng)


def linear_queries(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """The linear-query table (module docstring)."""
    from workloads.reviews import generate_reviews

    ratings = [generate_reviews(args.rows, rng)["rating"] for _ in range(args.blocks)]
    pool = linear_pool(args.pool, args.blocks, rng)
    print(f"\nlinear queries: pool {args.pool}, stream {args.stream}, {args.blocks} blocks of {args.rows} rows")
    print("| stream | distinct | ε without reuse | ε exact reuse | ε cache | ratio exact | ratio cache", end=" ")
    print("| paid (exact, cache) | misses, Σβ (cache; without reuse) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for skew in ("uniform", "zipf s=1"):
        order = stream(args.pool, args.stream, "uniform" if skew == "uniform" else "zipf", rng)
        without, _, missed, bound = replay_linear(pool, order, ratings, "without")
        exact, paid_exact, _, _ = replay_linear(pool, order, ratings, "exact")
        cache, paid_cache, cache_missed, cache_bound = replay_linear(pool, order, ratings, "cache")
        print(
            f"| {skew} | {len(set(order))} | {without:.2f} | {exact:.2f} | {cache:.2f} | {without / exact:.2f}× | {without / cache:.2f}× "
            f"| {paid_exact}, {paid_cache} | {cache_missed}, {cache_bound:.1f}; {missed}, {bound:.1f} |"
        )


if __name__ == "__main__":
    main()
