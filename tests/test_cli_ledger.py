"""The ledger commands, run as ``python -m privsched`` in subprocesses on real files."""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest

from privsched.budgets.curves import rdp_to_epsilon
from privsched.ledger import Ledger, PipelineRequest
from tests.support.blockdata import block_file

WIDE = {"COLUMNS": "200"}


def ok(result):
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_init_dataset_blocks_budget_and_audit_round_trip(run_cli, tmp_db):
    env = {"PRIVSCHED_DB": str(tmp_db), **WIDE}
    ok(run_cli("init", env=env))
    ok(run_cli("dataset", "create", "stats", "--epsilon", "1", "--delta", "1e-6", "--accounting", "basic", env=env))
    ok(run_cli("dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7", "--conversion", "tight", env=env))
    one = block_file(tmp_db.parent, "one.npz")
    block_file(tmp_db.parent, "2024-01-01.npz")
    ok(run_cli("blocks", "add", "stats", "d1", "d2", "--location", f"d1={one}", "--unlocked", "1", env=env))
    ok(run_cli("blocks", "add", "reviews", "2024-01-01", "--location-template", "data/{key}.npz", env=env))
    with Ledger(tmp_db) as ledger:  # relative to the folder the command ran in (run_cli's: tmp_db's)
        assert ledger.get_block("reviews", "2024-01-01").location == str(tmp_db.parent / "data/2024-01-01.npz")

    datasets = ok(run_cli("dataset", "list", env=env))
    assert "stats" in datasets and "reviews" in datasets and "tight" in datasets
    blocks = ok(run_cli("blocks", "list", "stats", env=env))
    assert "/data/one.npz" in blocks and "2024-01-01" not in blocks

    with Ledger(tmp_db) as ledger:
        pid = ledger.submit(PipelineRequest("p", "stats", ["d1"], demand=np.array([0.25, 1e-7])))
        ledger.grant([pid])
        info = ledger.get_dataset("reviews")
    shown = ok(run_cli("budget", "show", env=env))
    d1 = next([c.strip() for c in line.split("│")[1:-1]] for line in shown.splitlines() if line.startswith("│ d1 "))
    assert d1[2:5] == ["0.0 %", "25.0 %", "75.0 %"]  # consumed, allocated, left (ε binds)
    assert "0.75, 9e-07" in shown  # remaining on d1 as (ε, δ)
    live = info.capacity > 0
    fresh, _ = rdp_to_epsilon(info.capacity[live], np.array(info.accounting.alphas)[live], info.delta)
    assert f"│ {fresh:.4g} " in shown  # remaining of the untouched RDP block, as ε at δ_G
    assert "audit ok" in ok(run_cli("audit", env=env))


def test_db_defaults_to_the_environment_then_the_working_directory(run_cli, tmp_path):
    ok(run_cli("init"))
    assert (tmp_path / "privsched.db").exists()
    other = tmp_path / "other.db"
    ok(run_cli("init", env={"PRIVSCHED_DB": str(other)}))
    ok(run_cli("dataset", "create", "xyz", "--epsilon", "1", "--delta", "1e-6", "--db", str(other)))
    assert "xyz" not in ok(run_cli("dataset", "list"))
    with Ledger(other) as ledger:
        assert [d.name for d in ledger.list_datasets()] == ["xyz"]


@pytest.fixture
def populated(tmp_db):
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic")
        ledger.add_blocks("stats", ["d1"])
    return tmp_db


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dataset", "create", "y", "--epsilon", "-1", "--delta", "1e-6"], "epsilon"),
        (["dataset", "create", "y", "--epsilon", "nan", "--delta", "1e-6"], "epsilon"),
        (["dataset", "create", "y", "--epsilon", "1", "--delta", "1"], "delta"),
        (["dataset", "create", "stats", "--epsilon", "1", "--delta", "1e-6"], "already exists"),
        (["dataset", "create", "y", "--epsilon", "1", "--delta", "1e-6", "--alphas", "2,x"], "alphas"),
        (["blocks", "add", "nope", "k"], "unknown dataset"),
        (["blocks", "add", "stats", "d1"], "already exists"),
        (["blocks", "add", "stats", "k", "--location", "zz=/p"], "not among the blocks"),
    ],
)
def test_bad_input_prints_one_line_exits_non_zero_and_changes_nothing(run_cli, populated, dump_db, args, message):
    before = dump_db(populated)
    result = run_cli(*args, "--db", populated)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]
    assert dump_db(populated) == before


@pytest.mark.parametrize("kind", ["garbage", "foreign"])
def test_a_corrupt_or_foreign_database_gives_one_line_and_is_left_alone(run_cli, tmp_db, kind):
    if kind == "garbage":
        tmp_db.write_bytes(os.urandom(4096))
    elif kind == "foreign":
        conn = sqlite3.connect(tmp_db)
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
        conn.close()
    before = tmp_db.read_bytes()
    result = run_cli("dataset", "list", "--db", tmp_db)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "not a privsched database" in result.stderr
    assert tmp_db.read_bytes() == before


def test_audit_exits_non_zero_naming_each_violation(run_cli, populated):
    conn = sqlite3.connect(populated)
    conn.execute("UPDATE balances SET allocated = ?", [np.array([3.0, 0.0]).tobytes()])
    conn.commit()
    conn.close()
    result = run_cli("audit", "--db", populated)
    assert result.returncode == 1
    violations = result.stderr.strip().splitlines()
    assert all(line.startswith("violation: block stats/d1") for line in violations)
    assert any("safety invariant" in line for line in violations)
    assert any("capacity != locked + unlocked + allocated + consumed at ε" in line for line in violations)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("dataset", "create", "d", "--epsilon", "abc", "--delta", "1e-6"), "error: Invalid value for '--epsilon'"),
        (("nosuch",), "error: No such command 'nosuch'."),
        (("dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6", "--bogus"), "error: No such option: --bogus"),
    ],
)
def test_usage_errors_are_one_line_with_a_non_zero_exit(run_cli, tmp_db, args, expected):
    done = run_cli(*args, "--db", tmp_db) if args[0] != "nosuch" else run_cli(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected)
    assert not tmp_db.exists()
