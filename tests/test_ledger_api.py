"""The ledger API on real SQLite files: durability settings, every budget move of the
pipeline life cycle (docs/design.md §4.4), views, the lease, and the audit."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from privsched.ledger import BlockSpec, Ledger, LedgerError, PipelineRequest
from privsched.ledger.schema import APPLICATION_ID, SCHEMA_VERSION
from privsched.service.snapshot import snapshot_of
from tests.support.blockdata import block_file


@pytest.fixture
def ledger(tmp_db):
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic", now=0)
        ledger.add_blocks("stats", [BlockSpec("d1", block_file(tmp_db.parent, "d1")), BlockSpec("d2")], unlocked_fraction=1.0, now=0)
        ledger.create_dataset("reviews", 10.0, 1e-7, now=0)
        ledger.add_blocks("reviews", ["r1", "r2"], now=0)
        yield ledger


def basic(ledger, keys=("d1",), eps=0.5, **kw) -> int:
    return ledger.submit(PipelineRequest("p", "stats", list(keys), demand=np.array([eps, 1e-7]), **kw), now=1)


def test_a_new_database_is_durable_and_versioned(tmp_db):
    with Ledger.init(tmp_db) as ledger:
        pragma = lambda name: ledger.db.execute(f"PRAGMA {name}").fetchone()[0]  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("synchronous") == 2  # FULL
        assert pragma("busy_timeout") >= 1000
        assert pragma("user_version") == SCHEMA_VERSION
        assert pragma("application_id") == APPLICATION_ID
        assert pragma("foreign_keys") == 1


def test_init_is_idempotent_and_keeps_the_data(tmp_db):
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic")
    with Ledger.init(tmp_db) as ledger:
        assert [d.name for d in ledger.list_datasets()] == ["stats"]


def test_opening_a_missing_file_without_create_fails_and_creates_nothing(tmp_db):
    with pytest.raises(LedgerError, match="no privsched database"):
        Ledger(tmp_db)
    assert not tmp_db.exists()


def test_a_foreign_sqlite_file_is_refused_and_left_alone(tmp_db):
    conn = sqlite3.connect(tmp_db)
    conn.execute("CREATE TABLE songs (title TEXT)")
    conn.commit()
    conn.close()
    before = tmp_db.read_bytes()
    for create in (False, True):
        with pytest.raises(LedgerError, match="not a privsched database"):
            Ledger(tmp_db, create=create)
    assert tmp_db.read_bytes() == before


def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_db):
    tmp_db.write_bytes(os.urandom(8192))
    before = tmp_db.read_bytes()
    with pytest.raises(LedgerError, match="not a privsched database"):
        Ledger(tmp_db)
    assert tmp_db.read_bytes() == before


def test_a_damaged_privsched_file_gives_a_ledger_error_not_a_crash(tmp_db):
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic")
        ledger.add_blocks("stats", [f"b{i}" for i in range(200)])
        ledger.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(tmp_db.read_bytes())
    page = 4096
    data[page : 6 * page] = os.urandom(5 * page)
    tmp_db.write_bytes(bytes(data))
    with pytest.raises(LedgerError) as raised:
        with Ledger(tmp_db) as ledger:
            ledger.list_blocks()
            assert ledger.audit().ok  # damage outside the pages read must still be found
    assert "\n" not in str(raised.value)


def test_a_newer_schema_version_is_refused(tmp_db):
    Ledger.init(tmp_db).close()
    conn = sqlite3.connect(tmp_db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LedgerError, match="schema version"):
        Ledger(tmp_db)


def test_blocks_start_locked_except_the_unlocked_fraction(ledger):
    reviews = ledger.get_dataset("reviews")
    (block,) = ledger.add_blocks("reviews", ["r3"], unlocked_fraction=0.25)
    np.testing.assert_allclose(block.unlocked, reviews.capacity * 0.25)
    np.testing.assert_allclose(block.locked + block.unlocked, reviews.capacity)
    assert block.state == "active" and not block.allocated.any() and not block.consumed.any()


def test_unlock_is_capped_at_what_is_still_locked(ledger):
    r1 = ledger.get_block("reviews", "r1")
    ledger.unlock({r1.id: 0.75})
    ledger.unlock({r1.id: 0.75})
    after = ledger.get_block("reviews", "r1")
    np.testing.assert_allclose(after.unlocked, r1.capacity)
    assert np.all(after.locked == 0)


def test_grant_moves_the_demand_from_unlocked_to_allocated_on_every_block(ledger):
    pid = basic(ledger, keys=("d1", "d2"), eps=0.4)
    assert ledger.grant([pid], now=2) == [pid]
    for key in ("d1", "d2"):
        block = ledger.get_block("stats", key)
        np.testing.assert_allclose(block.allocated, [0.4, 1e-7])
        np.testing.assert_allclose(block.unlocked, [0.6, 9e-7])
    info = ledger.get_pipeline(pid)
    assert info.state == "granted" and info.granted_at == 2


def test_grant_is_all_or_nothing_and_best_effort_in_the_given_order(ledger):
    big = basic(ledger, keys=("d1",), eps=0.8)
    ledger.grant([big])
    wide = basic(ledger, keys=("d1", "d2"), eps=0.3)  # fits d2 but not d1
    small = basic(ledger, keys=("d2",), eps=0.3)
    assert ledger.grant([wide, small]) == [small]
    assert ledger.get_pipeline(wide).state == "pending"
    np.testing.assert_allclose(ledger.get_block("stats", "d2").allocated, [0.3, 1e-7])
    np.testing.assert_allclose(ledger.get_block("stats", "d1").allocated, [0.8, 1e-7])


def test_a_pipeline_already_granted_is_not_granted_twice(ledger):
    pid = basic(ledger, eps=0.2)
    assert ledger.grant([pid, pid]) == [pid]
    assert ledger.grant([pid]) == []
    np.testing.assert_allclose(ledger.get_block("stats", "d1").allocated, [0.2, 1e-7])


def test_rdp_grant_needs_one_order_and_charges_every_order(ledger):
    r1 = ledger.get_block("reviews", "r1")
    ledger.unlock({r1.id: 0.1})
    demand = np.zeros(r1.capacity.size)
    demand[-1] = 0.9  # fits only at α = 64
    demand[:-1] = r1.capacity[:-1]  # far more than unlocked elsewhere
    pid = ledger.submit(PipelineRequest("dp-sgd", "reviews", ["r1"], demand=demand))
    assert ledger.grant([pid]) == [pid]
    after = ledger.get_block("reviews", "r1")
    assert after.unlocked[-1] >= 0 and np.any(after.unlocked < 0)
    assert ledger.audit().ok


def test_a_pipeline_can_carry_a_mechanism_instead_of_a_demand(ledger):
    mechanism = '{"kind": "gaussian", "sigma": 4.0}'
    pid = ledger.submit(PipelineRequest("stat", "reviews", ["r1", "r2"], mechanism=mechanism))
    info = ledger.get_pipeline(pid)
    alphas = np.array(ledger.get_dataset("reviews").accounting.alphas)
    np.testing.assert_allclose(info.demands["r2"], alphas / 32)
    assert info.mechanism == mechanism


def test_a_request_whose_demand_is_below_its_mechanisms_curve_is_refused_and_nothing_changes(ledger, dump_db):
    mechanism = '{"kind": "gaussian", "sigma": 4.0}'
    alphas = np.array(ledger.get_dataset("reviews").accounting.alphas)
    before = dump_db(ledger.path)
    with pytest.raises(LedgerError, match="below the curve of its mechanism"):
        ledger.submit(PipelineRequest("stat", "reviews", ["r1"], demand=alphas / 64, mechanism=mechanism))
    assert dump_db(ledger.path) == before
    pid = ledger.submit(PipelineRequest("stat", "reviews", ["r1"], demand=alphas / 32, mechanism=mechanism))
    assert ledger.get_pipeline(pid).mechanism == mechanism


def test_complete_consumes_what_was_spent_and_releases_the_rest(ledger):
    pid = basic(ledger, eps=0.5)
    ledger.grant([pid])
    ledger.mark_running(pid, {"worker": "local-0"}, now=3)
    ledger.complete(pid, np.array([0.2, 0.0]), now=4)
    block = ledger.get_block("stats", "d1")
    np.testing.assert_allclose(block.consumed, [0.2, 0.0])
    np.testing.assert_allclose(block.unlocked, [0.8, 1e-6])
    assert not block.allocated.any()
    info = ledger.get_pipeline(pid)
    assert (info.state, info.placement, info.started_at, info.finished_at) == ("completed", {"worker": "local-0"}, 3, 4)
    np.testing.assert_allclose(info.consumed["d1"], [0.2, 0.0])


def test_complete_accepts_per_block_spending(ledger):
    pid = basic(ledger, keys=("d1", "d2"), eps=0.5)
    ledger.grant([pid])
    ledger.complete(pid, {"d1": [0.5, 1e-7], "d2": [0.0, 0.0]})
    assert ledger.get_block("stats", "d1").consumed[0] == 0.5
    assert ledger.get_block("stats", "d2").consumed[0] == 0.0


def test_failure_after_touching_data_consumes_the_whole_grant(ledger):
    pid = basic(ledger, eps=0.5)
    ledger.grant([pid])
    ledger.mark_running(pid, {})
    ledger.fail(pid, "out of memory")
    np.testing.assert_allclose(ledger.get_block("stats", "d1").consumed, [0.5, 1e-7])
    assert ledger.get_pipeline(pid).message == "out of memory"


def test_failure_before_touching_data_releases_the_grant(ledger):
    pid = basic(ledger, eps=0.5)
    ledger.grant([pid])
    ledger.fail(pid, "no worker", touched_data=False)
    block = ledger.get_block("stats", "d1")
    assert not block.consumed.any() and block.unlocked[0] == 1.0


def test_release_returns_a_failed_pipelines_budget_once_and_is_logged(ledger):
    pid = basic(ledger, eps=0.5)
    ledger.grant([pid])
    ledger.fail(pid, "crash")
    ledger.release(pid, "crash was before the first batch")
    block = ledger.get_block("stats", "d1")
    assert not block.consumed.any() and block.unlocked[0] == pytest.approx(1.0)
    assert [e.reason for e in ledger.events(pipeline_id=pid) if e.kind == "release"][0] == "crash was before the first batch"
    with pytest.raises(LedgerError, match="no consumed budget"):
        ledger.release(pid, "again")
    assert ledger.audit().ok


def test_cancel_releases_a_granted_pipeline_but_refuses_a_running_one(ledger):
    waiting, granted, running = basic(ledger, eps=0.1), basic(ledger, eps=0.2), basic(ledger, eps=0.3)
    ledger.grant([granted, running])
    ledger.mark_running(running, {})
    ledger.cancel(waiting)
    ledger.cancel(granted)
    with pytest.raises(LedgerError, match="running"):
        ledger.cancel(running)
    assert [ledger.get_pipeline(p).state for p in (waiting, granted, running)] == ["cancelled", "cancelled", "running"]
    np.testing.assert_allclose(ledger.get_block("stats", "d1").allocated, [0.3, 1e-7])


def test_expire_times_out_only_overdue_pending_pipelines(ledger):
    soon = basic(ledger, timeout=10)  # submitted at 1
    late = basic(ledger, timeout=100)
    forever = basic(ledger)
    assert ledger.expire(now=11) == [soon]
    assert {p.id for p in ledger.list_pipelines(["pending"])} == {late, forever}
    assert ledger.get_pipeline(soon).state == "timed_out"


def test_a_timed_out_pipeline_says_it_was_not_granted_within_its_timeout(ledger):
    soon = basic(ledger, timeout=10)
    ledger.expire(now=11)
    assert ledger.get_pipeline(soon).message == "not granted within its timeout of 10 s"
    assert [e.reason for e in ledger.events(pipeline_id=soon) if e.kind == "expire"] == [ledger.get_pipeline(soon).message]


def test_a_cancelled_pipeline_says_whether_it_was_waiting_or_granted(ledger):
    waiting, granted = basic(ledger, eps=0.1), basic(ledger, eps=0.2)
    ledger.grant([granted])
    ledger.cancel(waiting)
    ledger.cancel(granted)
    assert ledger.get_pipeline(waiting).message == "cancelled while waiting for a grant"
    assert ledger.get_pipeline(granted).message == "cancelled before its job started (its grant was released)"


def test_blocks_whose_budget_is_consumed_everywhere_are_retired(ledger):
    pid = basic(ledger, keys=("d1",), eps=1.0)
    ledger.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([1.0, 1e-6])))
    everything = ledger.submit(PipelineRequest("all", "stats", ["d2"], demand=np.array([1.0, 1e-6])))
    ledger.grant([pid, everything])
    ledger.complete(everything, np.array([1.0, 1e-6]))
    retired = ledger.retire_exhausted()
    assert retired == [ledger.get_block("stats", "d2").id]
    assert [b.key for b in ledger.list_blocks("stats", active_only=True)] == ["d1"]
    with pytest.raises(LedgerError, match="retired"):
        ledger.submit(PipelineRequest("late", "stats", ["d2"], demand=np.array([0.1, 0.0])))


def test_pending_view_holds_the_snapshot_arrays(ledger):
    r1, r2 = ledger.get_block("reviews", "r1"), ledger.get_block("reviews", "r2")
    k = r1.capacity.size
    a = ledger.submit(PipelineRequest("a", "reviews", ["r2"], demand=np.full(k, 0.1), weight=2.0), now=5)
    b = ledger.submit(PipelineRequest("b", "reviews", ["r1", "r2"], demands={"r1": np.full(k, 0.2), "r2": np.full(k, 0.3)}), now=6)
    view = ledger.pending_view("reviews")
    assert view.block_ids.tolist() == [r1.id, r2.id]
    assert view.pipelines.edge_block.tolist() == [r2.id, r1.id, r2.id]
    snapshot = snapshot_of(view)
    assert snapshot.pipeline_ids.tolist() == [a, b]
    assert snapshot.arrival.tolist() == [5, 6] and snapshot.weight.tolist() == [2.0, 1.0]
    assert snapshot.edge_pipeline.tolist() == [0, 1, 1]
    assert snapshot.edge_block.tolist() == [1, 0, 1]
    np.testing.assert_allclose(snapshot.edge_demand[:, 0], [0.1, 0.2, 0.3])
    assert snapshot.capacity.shape == snapshot.unlocked.shape == (2, k)
    assert snapshot.accounting == ledger.get_dataset("reviews").accounting


def test_the_event_log_is_append_only(ledger):
    for statement in ("UPDATE events SET reason = 'x'", "DELETE FROM events"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            ledger.db.execute(statement)


def test_every_balance_is_recomputable_from_the_events(ledger):
    pid = basic(ledger, eps=0.5)
    ledger.grant([pid])
    ledger.complete(pid, np.array([0.25, 0.0]))
    totals = {}
    for event in ledger.events(block_id=ledger.get_block("stats", "d1").id):
        if event.amount is not None:
            if event.source:
                totals[event.source] = totals.get(event.source, 0) - event.amount
            totals[event.target] = totals.get(event.target, 0) + event.amount
    block = ledger.get_block("stats", "d1")
    for bucket in ("locked", "unlocked", "allocated", "consumed"):
        np.testing.assert_allclose(totals.get(bucket, np.zeros(2)), getattr(block, bucket))


def test_audit_names_the_block_and_dimension_of_a_tampered_balance(ledger):
    d1 = ledger.get_block("stats", "d1")
    ledger.db.execute("UPDATE balances SET consumed = ? WHERE block_id = ?", [np.array([2.0, 0.0]).tobytes(), d1.id])
    report = ledger.audit()
    assert not report.ok
    text = "\n".join(report.violations)
    assert "stats/d1" in text and "consumed" in text and "ε" in text
    assert "safety invariant" in text


def test_lease_admits_one_scheduler_at_a_time(ledger):
    assert ledger.acquire_lease("sched-a", ttl=30, now=100)
    assert not ledger.acquire_lease("sched-b", ttl=30, now=110)
    assert ledger.renew_lease("sched-a", ttl=30, now=120)
    assert not ledger.acquire_lease("sched-b", ttl=30, now=149)
    assert ledger.lease_holder(now=149)["holder"] == "sched-a"
    assert ledger.acquire_lease("sched-b", ttl=30, now=151)  # a's lease expired at 150
    assert not ledger.renew_lease("sched-a", ttl=30, now=152)
    ledger.release_lease("sched-b")
    assert ledger.lease_holder(now=152) is None


def test_a_lease_held_by_a_dead_process_of_this_host_can_be_taken(ledger):
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from privsched.ledger import Ledger; print(Ledger(sys.argv[1]).acquire_lease('crashed', ttl=3600))",
            str(ledger.path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "True"
    assert ledger.lease_holder()["holder"] == "crashed"
    assert ledger.acquire_lease("successor", ttl=30)


def test_submit_many_writes_all_or_nothing(ledger, dump_db):
    before = dump_db(ledger.path)
    good = PipelineRequest("ok", "stats", ["d1"], demand=np.array([0.1, 0.0]))
    bad = PipelineRequest("bad", "stats", ["nope"], demand=np.array([0.1, 0.0]))
    with pytest.raises(LedgerError, match="unknown block 'nope'"):
        ledger.submit_many([good, bad])
    assert dump_db(ledger.path) == before
    assert len(ledger.submit_many([good, good])) == 2


K_RDP = 12


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda L: L.create_dataset("x", -1.0, 1e-6), "epsilon"),
        (lambda L: L.create_dataset("x", float("nan"), 1e-6), "epsilon"),
        (lambda L: L.create_dataset("x", 1.0, 1.0), "delta"),
        (lambda L: L.create_dataset("x", 1.0, 0.0), "delta > 0"),
        (lambda L: L.create_dataset("stats", 1.0, 1e-6), "already exists"),
        (lambda L: L.create_dataset("x", 1.0, 1e-6, accounting="zcdp"), "unknown accounting"),
        (lambda L: L.create_dataset("x", 1.0, 1e-6, alphas=[0.5, 2]), "orders"),
        (lambda L: L.create_dataset("x", 0.1, 1e-9, alphas=[1.5, 2.0]), "no RDP order"),
        (lambda L: L.create_dataset("x", 1.0, 1e-6, conversion="loose"), "conversion"),
        (lambda L: L.add_blocks("nope", ["k"]), "unknown dataset"),
        (lambda L: L.add_blocks("stats", ["d1"]), "already exists"),
        (lambda L: L.add_blocks("stats", ["n", "n"]), "duplicate"),
        (lambda L: L.add_blocks("stats", ["n"], unlocked_fraction=1.5), "unlocked fraction"),
        (lambda L: L.add_blocks("stats", []), "no blocks"),
        (lambda L: L.get_block("stats", "zz"), "unknown block"),
        (lambda L: L.submit(PipelineRequest("p", "nope", ["d1"], demand=np.array([0.1, 0.0]))), "unknown dataset"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["zz"], demand=np.array([0.1, 0.0]))), "unknown block"),
        (lambda L: L.submit(PipelineRequest("p", "stats", [], demand=np.array([0.1, 0.0]))), "no blocks"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([np.nan, 0]))), "finite"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([-0.1, 0]))), "non-negative"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"], demand=np.zeros(3))), "2 values"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([1.5, 0]))), "never be granted"),
        # fits only at the dead orders α ≤ 2.5 (capacity 0 there)
        (lambda L: L.submit(PipelineRequest("p", "reviews", ["r1"], demand=np.r_[np.zeros(4), np.full(8, 20.0)])), "never be granted"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"])), "needs a demand"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"], mechanism='{"kind": "gaussian", "sigma": 1}')), "basic accounting"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([0.1, 0.0]), weight=0)), "weight"),
        (lambda L: L.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([0.1, 0.0]), timeout=-1)), "timeout"),
        (lambda L: L.grant([999]), "unknown pipeline"),
        (lambda L: L.unlock({999: 0.5}), "unknown block"),
        (lambda L: L.unlock({1: float("nan")}), "fraction"),
        (lambda L: L.complete(1, np.zeros(2)), "pending"),
        (lambda L: L.mark_running(1, {}), "pending"),
        (lambda L: L.release(1, "why"), "pending"),
        (lambda L: L.list_pipelines(["waiting"]), "unknown pipeline state"),
    ],
)
def test_bad_input_raises_a_one_line_error_and_changes_nothing(ledger, dump_db, call, message):
    ledger.submit(PipelineRequest("existing", "stats", ["d1"], demand=np.array([0.1, 0.0])))
    before = dump_db(ledger.path)
    with pytest.raises(LedgerError, match=message) as raised:
        call(ledger)
    assert "\n" not in str(raised.value)
    assert dump_db(ledger.path) == before


def test_overspending_a_grant_is_refused_and_changes_nothing(ledger, dump_db):
    pid = basic(ledger, keys=("d1", "d2"), eps=0.5)
    ledger.grant([pid])
    before = dump_db(ledger.path)
    with pytest.raises(LedgerError, match="more than its grant on block 'd2' at ε"):
        ledger.complete(pid, {"d1": [0.5, 0.0], "d2": [0.6, 0.0]})
    with pytest.raises(LedgerError, match="outside the grant"):
        ledger.complete(pid, {"d1": [0.5, 0.0], "d2": [0.1, 0.0], "d3": [0.0, 0.0]})
    assert dump_db(ledger.path) == before


def test_audit_passes_after_repeated_partial_spends_that_drive_dead_orders_negative(ledger):
    from privsched.budgets import Gaussian, demand_vector, gaussian_sigma

    ledger.unlock({ledger.get_block("reviews", "r1").id: 1.0}, now=1)
    demand = demand_vector(Gaussian(sigma=gaussian_sigma(1.0, 1e-9)), ledger.get_dataset("reviews").accounting)
    for _ in range(3):
        pid = ledger.submit(PipelineRequest("p", "reviews", ["r1"], demand=demand), now=2)
        assert ledger.grant([pid], now=2) == [pid]
        ledger.mark_running(pid, {}, now=2)
        ledger.complete(pid, demand / 2, now=3)
    block = ledger.get_block("reviews", "r1")
    assert block.unlocked[0] < 0 == block.capacity[0]
    report = ledger.audit()
    assert report.ok, report.violations


def test_audit_passes_when_settling_in_another_order_leaves_rounding_residue_at_dead_orders(ledger):
    from privsched.budgets import Gaussian, demand_vector, gaussian_sigma

    ledger.unlock({ledger.get_block("reviews", "r1").id: 1.0}, now=1)
    accounting = ledger.get_dataset("reviews").accounting
    demands = [demand_vector(Gaussian(sigma=gaussian_sigma(e, 1e-9)), accounting) for e in (0.1, 0.5, 1.0)]
    ids = [ledger.submit(PipelineRequest("p", "reviews", ["r1"], demand=d), now=2) for d in demands]
    assert ledger.grant(ids, now=2) == ids
    for i in (2, 0, 1):
        ledger.mark_running(ids[i], {}, now=3)
        ledger.complete(ids[i], demands[i], now=4)
    report = ledger.audit()
    assert report.ok, report.violations
