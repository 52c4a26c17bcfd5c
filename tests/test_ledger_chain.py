"""The tamper-evident ledger: the hash chain over the event log, the audit that rebuilds
every table from it, direct edits of the SQLite file (real files, real edits), processes
killed mid-grant, file permissions, and demands that must charge something."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privsched.ledger import Ledger, LedgerError, PipelineRequest, chain
from privsched.ledger.schema import MIGRATES_FROM, SCHEMA_VERSION, pack
from tests.support import links

from .conftest import REPO


def build(path: Path) -> dict[str, int]:
    """A small ledger with every kind of event: datasets, blocks, unlocks, pipelines
    completed, failed, cancelled, granted and pending."""
    with Ledger.init(path) as ledger:
        ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic", now=0)
        ledger.add_blocks("stats", ["d1", "d2"], unlocked_fraction=1.0, now=0)
        ledger.create_dataset("reviews", 10.0, 1e-7, now=0)
        ledger.add_blocks("reviews", ["r1"], unlocked_fraction=0.5, now=0)
        curve = ledger.get_dataset("reviews").capacity * 0.1 + 0.01

        def request(keys, eps=0.2):
            return PipelineRequest(
                "p",
                "stats",
                keys,
                demand=np.array([eps, 1e-7]),
                owner="ann",
                job={"kind": "statistic"},
            )

        done, failed, cancelled, held, waiting = (ledger.submit(request(["d1", "d2"]), now=1) for _ in range(5))
        curved = ledger.submit(PipelineRequest("c", "reviews", ["r1"], demand=curve), now=1)
        ledger.grant([done, failed, cancelled, held, curved], now=2)
        ledger.mark_running(done, {"host": "here"}, now=3)
        ledger.complete(done, np.array([0.1, 1e-7]), now=4)
        ledger.fail(failed, "crashed", now=4)
        ledger.cancel(cancelled, now=4)
        assert ledger.audit().ok
    return {"done": done, "failed": failed, "cancelled": cancelled, "held": held, "waiting": waiting, "curved": curved}


@pytest.fixture
def db(tmp_db) -> tuple[Path, dict[str, int]]:
    return tmp_db, build(tmp_db)


def edit(path: Path, *statements: tuple[str, list]) -> None:
    """Change the file directly, as anyone who can write it could (triggers dropped)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS events_no_update")
    conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
    for sql, params in statements:
        assert conn.execute(sql, params).rowcount >= 1, sql
    conn.close()


def violations(path: Path, expect: str | None = None) -> str:
    with Ledger(path) as ledger:
        report = ledger.audit(expect=expect)
    assert not report.ok
    return "\n".join(report.violations)


def cli(*args: object) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PRIVSCHED_DB"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "privsched", *map(str, args)], capture_output=True, text=True, env=env)


def event_id(path: Path, where: str, params: list) -> int:
    conn = sqlite3.connect(path)
    found = conn.execute(f"SELECT id FROM events WHERE {where} ORDER BY id LIMIT 1", params).fetchone()
    conn.close()
    return found[0]


# ------------------------------------------------------------------------------ the chain
def test_every_event_row_links_to_the_previous_one(db):
    path, _ = db
    conn = sqlite3.connect(path)
    rows = conn.execute(f"SELECT {', '.join(links.COLUMNS)}, hash FROM events ORDER BY id").fetchall()
    conn.close()
    stored = [row[-1] for row in rows]
    assert stored == list(links.links([row[:-1] for row in rows]))
    assert [row[0] for row in rows] == list(range(1, len(rows) + 1))


field = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8))


@given(
    st.lists(field, min_size=len(chain.COLUMNS), max_size=len(chain.COLUMNS)),
    st.lists(field, min_size=len(chain.COLUMNS), max_size=len(chain.COLUMNS)),
)
def test_distinct_rows_encode_differently(a, b):
    same = all(
        type(x) is type(y) and (x == y if not isinstance(x, float) else np.float64(x).tobytes() == np.float64(y).tobytes())
        for x, y in zip(a, b)
    )
    assert (chain.encode(a) == chain.encode(b)) == same


def test_a_chain_head_must_be_well_formed():
    assert chain.parse_head(chain.format_head(7, bytes(32))) == (7, bytes(32))
    for text in ("", "7", "x:00", f"7:{'ab' * 31}", f"-1:{'ab' * 32}"):
        with pytest.raises(ValueError, match="chain head"):
            chain.parse_head(text)


# ------------------------------------------------------------------- an untouched ledger
def test_an_untouched_ledger_passes_and_exports_its_head(db):
    path, _ = db
    with Ledger(path) as ledger:
        report = ledger.audit()
        last = ledger.events()[-1].id
    assert report.ok and report.head.startswith(f"{last}:")
    shown = cli("audit", "--db", path)
    assert shown.returncode == 0 and report.head in shown.stdout
    exported = cli("audit", "--db", path, "--export")
    assert exported.returncode == 0 and exported.stdout.strip() == report.head
    assert cli("audit", "--db", path, "--expect", report.head).returncode == 0


def test_a_kept_head_still_holds_after_more_events(db):
    path, ids = db
    with Ledger(path) as ledger:
        head = ledger.audit().head
        ledger.complete(ids["held"], np.array([0.0, 0.0]))
        after = ledger.audit(expect=head)
    assert after.ok and after.head != head


def test_a_malformed_kept_head_is_refused_in_one_line(db):
    path, _ = db
    result = cli("audit", "--db", path, "--expect", "nonsense")
    assert result.returncode == 1
    assert result.stderr.startswith("error:") and "chain head" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------- direct SQLite edits
def assert_cli_names(path: Path, *words: str) -> None:
    result = cli("audit", "--db", path)
    assert result.returncode == 1
    for word in words:
        assert word in result.stderr, result.stderr


def test_a_raised_block_capacity_is_reported(db):
    path, _ = db
    edit(
        path,
        (
            "UPDATE balances SET capacity = ?, unlocked = ? WHERE block_id = (SELECT id FROM blocks WHERE key = 'd1')",
            [pack(np.array([5.0, 1e-6])), pack(np.array([4.6, 1e-6]))],
        ),
    )
    text = violations(path)
    assert "stats/d1: stored capacity differs from the event log at ε" in text
    assert_cli_names(path, "stats/d1", "capacity")


def test_a_raised_dataset_capacity_is_reported(db):
    path, _ = db
    edit(path, ("UPDATE datasets SET epsilon = 5.0, capacity = ? WHERE name = 'stats'", [pack(np.array([5.0, 1e-6]))]))
    text = violations(path)
    assert "dataset 'stats': stored epsilon differs" in text and "dataset 'stats': stored capacity differs" in text


def test_a_changed_balance_is_reported(db):
    path, _ = db
    edit(
        path, ("UPDATE balances SET unlocked = ? WHERE block_id = (SELECT id FROM blocks WHERE key = 'd2')", [pack(np.array([1.0, 1e-6]))])
    )
    assert "stats/d2: stored unlocked differs from the event log" in violations(path)
    assert_cli_names(path, "stats/d2", "unlocked")


def test_a_changed_demand_is_reported(db):
    path, ids = db
    edit(path, ("UPDATE demands SET demand = ? WHERE pipeline_id = ?", [pack(np.array([1e-9, 0.0])), ids["waiting"]]))
    assert f"pipeline {ids['waiting']}: stored demands differ from its submission" in violations(path)
    assert_cli_names(path, f"pipeline {ids['waiting']}", "demands")


def test_a_changed_pipeline_state_is_reported(db):
    path, ids = db
    edit(path, ("UPDATE pipelines SET state = 'granted' WHERE id = ?", [ids["waiting"]]))
    assert f"pipeline {ids['waiting']}: stored state differs from the event log" in violations(path)


def test_a_changed_block_location_or_state_is_reported(db):
    path, _ = db
    edit(
        path,
        ("UPDATE blocks SET location = '/data/other' WHERE key = 'd1'", []),
        ("UPDATE blocks SET state = 'retired' WHERE key = 'd2'", []),
    )
    text = violations(path)
    assert "block 'd1' (id 1): stored location differs from the event log" in text
    assert "block 'd2' (id 2): stored state differs from the event log" in text


def test_a_deleted_pipeline_row_is_reported(db):
    path, ids = db
    edit(path, ("DELETE FROM demands WHERE pipeline_id = ?", [ids["waiting"]]), ("DELETE FROM pipelines WHERE id = ?", [ids["waiting"]]))
    assert f"pipeline {ids['waiting']}: submitted by event" in violations(path)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "privsched.db"
    build(path)
    with Ledger(path) as ledger:  # fold the WAL into the main file, so one file is the database
        ledger.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def other_value(value: object, seed: int) -> object:
    if isinstance(value, bytes):
        return bytes([value[0] ^ (1 + seed % 255)]) + value[1:] if value else b"x"
    if isinstance(value, float):
        return value + 1.0 + seed
    if isinstance(value, int):
        return value + 1 + seed
    if isinstance(value, str):
        return value + str(seed)
    return "x" if seed % 2 else 1


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_any_change_to_any_event_column_is_reported_on_that_event(template, tmp_path_factory, data):
    path = tmp_path_factory.mktemp("edited") / "privsched.db"
    path.write_bytes(template.read_bytes())
    conn = sqlite3.connect(path)
    count = conn.execute("SELECT count(*) FROM events").fetchone()[0]
    conn.close()
    event = data.draw(st.integers(1, count), label="event")
    column = data.draw(st.sampled_from([c for c in chain.COLUMNS if c != "id"]), label="column")
    conn = sqlite3.connect(path)
    value = conn.execute(f"SELECT {column} FROM events WHERE id = ?", [event]).fetchone()[0]
    conn.close()
    changed = other_value(value, data.draw(st.integers(0, 1000), label="seed"))
    try:
        edit(path, (f"UPDATE events SET {column} = ? WHERE id = ?", [changed, event]))
    except sqlite3.IntegrityError:  # NOT NULL, or a STRICT type: SQLite itself refuses the edit
        return
    assert f"event {event}: hash does not match" in violations(path)


def test_blobs_of_the_wrong_length_are_reported_not_a_crash(db):
    path, ids = db
    edit(
        path,
        ("UPDATE balances SET locked = x'00' WHERE block_id = (SELECT id FROM blocks WHERE key = 'r1')", []),
        ("UPDATE demands SET demand = x'0000' WHERE pipeline_id = ?", [ids["held"]]),
    )
    text = violations(path)
    assert "block reviews/r1: a stored balance is not a budget vector" in text
    assert f"pipeline {ids['held']}: stored demands differ" in text
    assert f"pipeline {ids['held']} on block stats/d1: a stored demand or consumption is not a budget vector" in text


def test_a_deleted_event_is_reported_by_its_id(db):
    path, ids = db
    gone = event_id(path, "kind = 'grant' AND pipeline_id = ? AND amount IS NOT NULL", [ids["held"]])
    edit(path, ("DELETE FROM events WHERE id = ?", [gone]))
    text = violations(path)
    assert f"event {gone} missing before event {gone + 1} (deleted)" in text
    assert f"event {gone + 1}: hash does not match" in text
    assert_cli_names(path, f"event {gone}")


def test_an_altered_event_is_reported_by_its_id(db):
    path, ids = db
    altered = event_id(path, "kind = 'grant' AND pipeline_id = ? AND amount IS NOT NULL", [ids["curved"]])
    edit(path, ("UPDATE events SET amount = ? WHERE id = ?", [pack(np.zeros(12)), altered]))
    text = violations(path)
    assert f"event {altered}: hash does not match" in text
    assert_cli_names(path, f"event {altered}")


def test_an_inserted_event_is_reported(db):
    path, _ = db
    conn = sqlite3.connect(path)
    last_id, last_hash = conn.execute("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1").fetchone()
    conn.close()
    edit(path, ("INSERT INTO events (id, at, kind, source, target, hash) VALUES (?, 9, 'note', NULL, 'x', ?)", [last_id + 1, b"\0" * 32]))
    assert f"event {last_id + 1}: hash does not match" in violations(path)


def test_history_rewritten_with_fresh_hashes_fails_only_against_a_kept_head(db):
    """Anyone who can write the file can recompute SHA-256 links: the chain then shows no
    break, and only a head kept outside the database proves the rewrite."""
    path, _ = db
    with Ledger(path) as ledger:
        head = ledger.audit().head
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER events_no_update")
    rows = conn.execute(f"SELECT {', '.join(chain.COLUMNS)} FROM events ORDER BY id").fetchall()
    rows[3] = (*rows[3][:9], "rewritten reason", *rows[3][10:])
    for row, digest in zip(rows, links.links(rows)):
        conn.execute("UPDATE events SET reason = ?, hash = ? WHERE id = ?", [row[9], digest, row[0]])
    conn.close()
    with Ledger(path) as ledger:
        assert ledger.audit().ok
    event = int(head.split(":")[0])
    assert f"kept head: event {event} has a different hash now" in violations(path, expect=head)
    assert cli("audit", "--db", path, "--expect", head).returncode == 1


def test_a_truncated_log_fails_against_a_kept_head(db):
    path, _ = db
    with Ledger(path) as ledger:
        head = ledger.audit().head
        ledger.create_dataset("later", 1.0, 1e-6, accounting="basic")
        later = ledger.audit().head
    event = int(later.split(":")[0])
    edit(path, ("DELETE FROM events WHERE id = ?", [event]), ("DELETE FROM datasets WHERE name = 'later'", []))
    with Ledger(path) as ledger:
        assert ledger.audit(expect=head).ok  # the log still holds the older head ...
    assert f"kept head: event {event} is no longer in the log" in violations(path, expect=later)


# ------------------------------------------------------------------------- crashes
GRANT_FOREVER = """
import sys, numpy as np
from privsched.ledger import Ledger
with Ledger(sys.argv[1]) as ledger:
    print("ready", flush=True)
    for pid in [p.id for p in ledger.list_pipelines(["pending"])]:
        ledger.grant([pid])
        if pid % 4 == 0:
            ledger.complete(pid, ledger.get_pipeline(pid).demands["k0"] * 0.5)
"""


@pytest.mark.parametrize("kill_after", [3, 30])
def test_an_untouched_ledger_passes_after_a_sigkill_mid_grant(tmp_db, kill_after):
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("data", 1000.0, 1e-6, accounting="basic")
        ledger.add_blocks("data", [f"k{i}" for i in range(20)], unlocked_fraction=1.0)
        ledger.submit_many([PipelineRequest("p", "data", [f"k{i}" for i in range(20)], demand=np.array([0.5, 0.0])) for _ in range(120)])
        head = ledger.audit().head
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", GRANT_FOREVER, str(tmp_db)], env=env, stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"ready"
    conn = sqlite3.connect(tmp_db, timeout=30)
    while conn.execute("SELECT count(*) FROM pipelines WHERE state != 'pending'").fetchone()[0] < kill_after:
        assert child.poll() is None
        time.sleep(0.002)
    conn.close()
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    result = cli("audit", "--db", tmp_db, "--expect", head)
    assert result.returncode == 0, result.stderr
    with Ledger(tmp_db) as ledger:
        granted = ledger.list_pipelines(["granted", "completed"])
        assert kill_after <= len(granted) < 120
        ledger.grant([p.id for p in ledger.list_pipelines(["pending"])][:2])  # the chain goes on after the crash
        assert ledger.audit(expect=head).ok


# ---------------------------------------------------------------------- schema version
@pytest.mark.parametrize("version", range(1, MIGRATES_FROM))
def test_a_database_of_an_older_schema_is_refused_in_one_line(tmp_db, dump_db, version):
    with Ledger.init(tmp_db):
        pass
    conn = sqlite3.connect(tmp_db)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    before = dump_db(tmp_db)
    with pytest.raises(LedgerError, match=f"older ledger schema version {version} .*version {SCHEMA_VERSION}"):
        Ledger(tmp_db)
    result = cli("audit", "--db", tmp_db)
    assert result.returncode == 1 and f"older ledger schema version {version}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert dump_db(tmp_db) == before


# ---------------------------------------------------------------------- permissions
def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_database_and_its_wal_and_shm_are_private(tmp_db):
    previous = os.umask(0o002)  # a permissive umask must not leak into the ledger's files
    try:
        with Ledger.init(tmp_db) as ledger:
            ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic")
            files = [tmp_db, Path(f"{tmp_db}-wal"), Path(f"{tmp_db}-shm")]
            assert all(f.exists() for f in files)
            assert [mode(f) for f in files] == [0o600] * 3
        assert mode(tmp_db) == 0o600
        assert os.umask(0o002) == 0o002  # the process umask is restored
    finally:
        os.umask(previous)


def test_the_cli_creates_a_private_database(tmp_db):
    assert cli("init", "--db", tmp_db).returncode == 0
    assert mode(tmp_db) == 0o600


def test_a_database_others_may_write_warns_once(tmp_db, capfd):
    with Ledger.init(tmp_db):
        pass
    capfd.readouterr()
    tmp_db.chmod(0o666)
    for _ in range(3):
        with Ledger(tmp_db) as ledger:
            ledger.list_datasets()
    warnings = [line for line in capfd.readouterr().err.splitlines() if line]
    assert len(warnings) == 1
    assert warnings[0].startswith("warning:") and "writable by other users" in warnings[0] and "0666" in warnings[0]


def test_a_private_database_opens_without_warning(tmp_db, capfd):
    with Ledger.init(tmp_db):
        pass
    with Ledger(tmp_db):
        pass
    assert capfd.readouterr().err == ""


# ------------------------------------------------------------------ demands must charge
@pytest.fixture(scope="module")
def demand_ledger(tmp_path_factory) -> Ledger:
    path = tmp_path_factory.mktemp("demands") / "privsched.db"
    with Ledger.init(path) as ledger:
        ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic")
        ledger.add_blocks("stats", ["d1"], unlocked_fraction=1.0)
        ledger.create_dataset("reviews", 10.0, 1e-7)  # orders α ≤ 2.5 are dead
        ledger.add_blocks("reviews", ["r1"], unlocked_fraction=1.0)
        yield ledger


def count_pipelines(ledger: Ledger) -> int:
    return ledger.db.execute("SELECT count(*) FROM pipelines").fetchone()[0]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, -0.0, 1e-12, 0.3, -0.1]), min_size=12, max_size=12), st.sampled_from(["demand", "demands", "explicit"])
)
def test_a_demand_is_accepted_only_if_positive_at_every_live_order(demand_ledger, values, how):
    ledger = demand_ledger
    curve = np.array(values)
    live = ledger.get_dataset("reviews").capacity > 0
    request = PipelineRequest("p", "reviews", ["r1"])
    if how == "demand":
        request.demand = curve
    elif how == "demands":
        request.demands = {"r1": curve}
    else:
        request.mechanism = json.dumps({"kind": "explicit", "values": values})
    before = count_pipelines(ledger)
    if np.all(curve[live] > 0) and np.all(curve >= 0):
        ledger.submit(request)
        assert count_pipelines(ledger) == before + 1
    else:
        with pytest.raises(LedgerError) as refused:
            ledger.submit(request)
        assert "\n" not in str(refused.value)
        assert count_pipelines(ledger) == before


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([0.0, -0.5, 1e-9, 0.2]), st.sampled_from([0.0, -1e-7, 1e-7]))
def test_a_basic_demand_needs_a_positive_epsilon_and_may_have_zero_delta(demand_ledger, epsilon, delta):
    ledger = demand_ledger
    before = count_pipelines(ledger)
    request = PipelineRequest("p", "stats", ["d1"], demand=np.array([epsilon, delta]))
    if epsilon > 0 and delta >= 0:
        ledger.submit(request)
        assert count_pipelines(ledger) == before + 1
    else:
        with pytest.raises(LedgerError, match="must be (positive|non-negative)"):
            ledger.submit(request)
        assert count_pipelines(ledger) == before


def test_a_zero_explicit_mechanism_is_refused_by_the_cli_in_one_line(tmp_path, tmp_db, dump_db):
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("reviews", 10.0, 1e-7)
        ledger.add_blocks("reviews", ["r1"], unlocked_fraction=1.0)
    spec = tmp_path / "free.yaml"
    spec.write_text(
        "name: free\ndataset: reviews\nblocks: [r1]\n"
        f"mechanism: {{kind: explicit, values: {[0.0] * 12}}}\n"
        "job: {function: 'tests.service_jobs:spend_half'}\n"
    )
    before = dump_db(tmp_db)
    result = cli("submit", spec, "--db", tmp_db)
    assert result.returncode == 1
    assert result.stderr.startswith("error:") and "must be positive at every live order" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert dump_db(tmp_db) == before
