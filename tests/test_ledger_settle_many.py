"""Settling jobs that ended together in one transaction: the same balances, states and
actors as settling each alone, all or none, and one disk-synced commit for all."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privsched.jobs.runner import JobResult
from privsched.ledger import BlockSpec, Ledger, LedgerError, PipelineRequest
from privsched.ledger.models import Ending
from privsched.service.settle import settle, settle_together

KEYS = ("d1", "d2", "d3")


def granted_ledger(path: Path, demands: list[float]) -> tuple[Ledger, list[int]]:
    """A basic dataset of three blocks (ε_G = 1), one granted, running pipeline per demand,
    pipeline i on blocks d(i mod 3) and d(i+1 mod 3)."""
    ledger = Ledger.init(path)
    ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic", now=0)
    ledger.add_blocks("stats", [BlockSpec(k) for k in KEYS], unlocked_fraction=1.0, now=0)
    ids = []
    for i, eps in enumerate(demands):
        keys = [KEYS[i % 3], KEYS[(i + 1) % 3]]
        ids.append(ledger.submit(PipelineRequest(f"p{i}", "stats", keys, demand=np.array([eps, 1e-8])), now=1))
    assert ledger.grant(ids, now=2) == ids
    for pipeline_id in ids:
        ledger.mark_running(pipeline_id, {}, now=3)
    return ledger, ids


def result(pipeline_id: int, keys: list[str], outcome: tuple[str, float]) -> JobResult:
    kind, share = outcome
    if kind == "complete":
        return JobResult(pipeline_id, completed=True, spent={k: [share * 0.1, 0.0] for k in keys})
    return JobResult(pipeline_id, completed=False, message=f"{kind} failure", touched_data=kind == "touched")


def holdings(ledger: Ledger) -> list[tuple]:
    blocks = [(b.key, b.unlocked.tolist(), b.allocated.tolist(), b.consumed.tolist()) for b in ledger.list_blocks("stats")]
    pipelines = [(p.id, p.state, p.message) for p in ledger.list_pipelines()]
    return [*blocks, *pipelines]


OUTCOMES = st.lists(st.tuples(st.sampled_from(["complete", "touched", "untouched"]), st.floats(0.0, 1.0)), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outcomes=OUTCOMES, actor=st.sampled_from([None, "alice"]))
def test_settling_together_leaves_the_ledger_as_settling_each_alone(tmp_path: Path, outcomes, actor):
    folder = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    demands = [0.1] * len(outcomes)
    alone, ids = granted_ledger(folder / "alone.db", demands)
    together, _ = granted_ledger(folder / "together.db", demands)
    results = [result(i, list(together.get_pipeline(i).block_keys), o) for i, o in zip(ids, outcomes)]
    for job in results:
        settle(alone, job, now=5, actor=actor)
    states = settle_together(together, results, now=5, actors=[actor] * len(results))
    assert states == [p.state for p in alone.list_pipelines()]
    assert holdings(together) == holdings(alone)
    assert [(e.kind, e.actor) for e in together.events()] == [(e.kind, e.actor) for e in alone.events()]
    assert together.audit().ok and alone.audit().ok
    alone.close()
    together.close()
    shutil.rmtree(folder)


def test_one_refused_ending_refuses_them_all_and_changes_nothing(tmp_db: Path, dump_db):
    ledger, ids = granted_ledger(tmp_db, [0.1, 0.1])
    before = dump_db(tmp_db)
    over = Ending(ids[1], spent={"d2": np.array([0.5, 0.0]), "d3": np.array([0.0, 0.0])})  # above its grant of 0.1
    with pytest.raises(LedgerError, match="spent more than its grant"):
        ledger.settle_many([Ending(ids[0], spent={"d1": np.zeros(2), "d2": np.zeros(2)}), over], now=5)
    assert dump_db(tmp_db) == before
    ledger.close()


def test_a_refused_batch_is_left_to_settling_each_alone(tmp_db: Path):
    """settle_together records nothing and says so; settle then gives each its own outcome."""
    ledger, ids = granted_ledger(tmp_db, [0.1, 0.1])
    fine = JobResult(ids[0], completed=True, spent={"d1": [0.05, 0.0], "d2": [0.0, 0.0]})
    over = JobResult(ids[1], completed=True, spent={"d2": [0.5, 0.0], "d3": [0.0, 0.0]})
    assert settle_together(ledger, [fine, over], now=5, actors=[None, None]) is None
    assert [p.state for p in ledger.list_pipelines()] == ["running", "running"]
    assert [settle(ledger, job, now=5) for job in (fine, over)] == ["completed", "failed"]
    assert "reported spending was refused" in ledger.get_pipeline(ids[1]).message
    ledger.close()


def test_settling_together_is_one_commit(tmp_db: Path):
    ledger, ids = granted_ledger(tmp_db, [0.1, 0.1, 0.1])
    statements: list[str] = []
    ledger.db.conn.set_trace_callback(statements.append)
    results = [JobResult(i, completed=False, message="gone", touched_data=False) for i in ids]
    assert settle_together(ledger, results, now=5, actors=[None, None, "alice"]) == ["failed"] * 3
    ledger.db.conn.set_trace_callback(None)
    assert statements.count("COMMIT") == 1
    assert [e.actor for e in ledger.events() if e.kind == "fail"][-1] == "alice"
    ledger.close()


def test_a_malformed_ending_is_refused_before_anything_is_written(tmp_db: Path, dump_db):
    ledger, ids = granted_ledger(tmp_db, [0.1])
    before = dump_db(tmp_db)
    for bad in ([object()], [Ending(ids[0], message=3)], [Ending(ids[0], actor="")], [Ending(-1)]):
        with pytest.raises(LedgerError):
            ledger.settle_many(bad, now=5)  # type: ignore[list-item]
    assert dump_db(tmp_db) == before
    ledger.close()
