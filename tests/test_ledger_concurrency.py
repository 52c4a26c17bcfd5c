"""Several processes on one ledger file, and a process killed mid-stream (real files, real
processes): no over-spend, no lost update, no "database is locked", no half-applied grant."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sqlite3
import time

import numpy as np
import pytest

from privsched.ledger import Ledger, PipelineRequest

FORK = multiprocessing.get_context("fork")
WORKERS, ROUNDS, BLOCKS = 4, 25, 3


def contend(path: str, seed: int, results) -> None:
    """Submit, grant and settle pipelines on shared blocks; report what happened."""
    rng = random.Random(seed)
    spent: list[tuple[int, dict[str, list[float]]]] = []
    try:
        with Ledger(path) as ledger:
            for _ in range(ROUNDS):
                keys = rng.sample([f"b{i}" for i in range(BLOCKS)], 2)
                demand = np.array([rng.choice([0.02, 0.05]), 0.0])
                pid = ledger.submit(PipelineRequest("w", "shared", keys, demand=demand))
                if ledger.grant([pid]) == [pid]:
                    used = demand * rng.choice([0.5, 1.0])
                    ledger.complete(pid, used)
                    spent.append((pid, {k: used.tolist() for k in keys}))
        results.put((seed, spent, None))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((seed, spent, f"{type(exc).__name__}: {exc}"))


def test_concurrent_processes_never_overspend_or_lose_updates(tmp_db):
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("shared", 1.0, 1e-6, accounting="basic")
        ledger.add_blocks("shared", [f"b{i}" for i in range(BLOCKS)], unlocked_fraction=1.0)
    results = FORK.Queue()
    workers = [FORK.Process(target=contend, args=(str(tmp_db), seed, results)) for seed in range(WORKERS)]
    for worker in workers:
        worker.start()
    reports = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    assert [error for _, _, error in reports if error] == []
    expected = {f"b{i}": np.zeros(2) for i in range(BLOCKS)}
    completed = 0
    for _, spent, _ in reports:
        for _, per_block in spent:
            completed += 1
            for key, used in per_block.items():
                expected[key] += used
    with Ledger(tmp_db) as ledger:
        assert ledger.audit().ok
        assert completed == len(ledger.list_pipelines(["completed"]))
        for block in ledger.list_blocks("shared"):
            np.testing.assert_allclose(block.consumed, expected[block.key], rtol=1e-9)
            assert np.all(block.consumed <= block.capacity * (1 + 1e-9))
            np.testing.assert_allclose(block.allocated, 0.0, atol=1e-12)  # float residue of += / -= only
    total_demand = WORKERS * ROUNDS * 2 * 0.02
    assert total_demand > BLOCKS  # the blocks were over-subscribed, so budget was contended


def grant_stream(path: str, ids: list[int]) -> None:
    with Ledger(path) as ledger:
        for pid in ids:
            ledger.grant([pid])
            if pid % 3 == 0:
                ledger.complete(pid, ledger.get_pipeline(pid).demands["k0"] * 0.5)


def granted_count(path) -> int:
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute("SELECT count(*) FROM pipelines WHERE state != 'pending'").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize("kill_after", [5, 40])
def test_a_process_killed_mid_stream_leaves_no_half_applied_grant(tmp_db, kill_after):
    n_blocks, n_pipelines = 60, 400
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("data", 1000.0, 1e-6, accounting="basic")
        ledger.add_blocks("data", [f"k{i}" for i in range(n_blocks)], unlocked_fraction=1.0)
        requests = [
            PipelineRequest("p", "data", [f"k{i}" for i in range(n_blocks)], demand=np.array([0.5, 0.0])) for _ in range(n_pipelines)
        ]
        ids = ledger.submit_many(requests)
    child = FORK.Process(target=grant_stream, args=(str(tmp_db), ids))
    child.start()
    while granted_count(tmp_db) < kill_after and child.is_alive():
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL
    with Ledger(tmp_db) as ledger:
        report = ledger.audit()
        assert report.ok, report.violations
        pipelines = ledger.list_pipelines()
        granted = [p for p in pipelines if p.state != "pending"]
        assert kill_after <= len(granted) < n_pipelines
        for pipeline in pipelines:
            grants = [e for e in ledger.events(pipeline_id=pipeline.id) if e.kind == "grant" and e.amount is not None]
            assert len(grants) == (n_blocks if pipeline.state != "pending" else 0)
        allocated = sum(p.demands["k0"][0] for p in pipelines if p.state == "granted")
        consumed = sum(p.consumed["k0"][0] for p in pipelines if p.state == "completed")
        for block in ledger.list_blocks("data"):
            assert block.allocated[0] == pytest.approx(allocated)
            assert block.consumed[0] == pytest.approx(consumed)
