"""Each ``privsched`` command imports its own command module and no heavy library it does
not use (torch, opacus, ray, matplotlib, scipy), checked in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

HEAVY = ("torch", "opacus", "ray", "matplotlib", "scipy")
COMMAND_MODULES = ("ledger_cmds", "sim_cmds", "submit_cmds", "service_cmds", "demo_cmds", "user_cmds")

#: Libraries a command that reads the ledger without computing on budgets does not load:
#: the ledger is read with the standard library's sqlite3, vectors decoded on first use.
READ_PATH_HEAVY = ("numpy", "sqlite_utils")

#: Runs ``privsched <argv>`` through ``main`` and prints which of the modules named in
#: ``$PROBE_WATCH`` (and of the command modules) it loaded. A host that calls ``cli.main``
#: keeps running after the command (the ``privsched`` program, whose ``__main__`` holds
#: ``main`` itself, may end without the interpreter's teardown).
PROBE = f"""
import json, os, sys
from privsched import cli
sys.argv = ["privsched", *sys.argv[1:]]
try:
    cli.main()
except SystemExit as exit:
    code = exit.code
loaded = [m for m in os.environ["PROBE_WATCH"].split(",") if m in sys.modules]
loaded += [m for m in {COMMAND_MODULES!r} if "privsched.cli." + m in sys.modules]
print(json.dumps({{"code": code, "loaded": loaded}}))
"""


def probe(*args: object, cwd: Path, watch: tuple[str, ...] = HEAVY) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PRIVSCHED_DB"}
    env["PYTHONPATH"] = str(REPO)
    env["PROBE_WATCH"] = ",".join(watch)
    result = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True)
    return json.loads(result.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def database(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    db = folder / "p.db"
    spec = folder / "count.json"
    spec.write_text(
        json.dumps(
            {
                "name": "count",
                "dataset": "reviews",
                "blocks": {"last": 1},
                "epsilon": 0.1,
                "job": {"kind": "statistic", "params": {"query": "count"}},
            }
        )
    )
    for args in (
        ["init"],
        ["dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7"],
        ["blocks", "add", "reviews", "d1", "d2"],
        ["submit", spec],
        ["submit", spec],
    ):
        assert probe(*args, "--db", db, cwd=folder)["code"] == 0
    return db


@pytest.mark.parametrize(
    ("args", "modules"),
    [
        (["init"], ["ledger_cmds"]),
        (["dataset", "list"], ["ledger_cmds"]),
        (["blocks", "list"], ["ledger_cmds"]),
        (["budget", "show"], ["ledger_cmds"]),
        (["audit"], ["ledger_cmds"]),
        (["list"], ["service_cmds"]),
        (["status", "1"], ["ledger_cmds", "service_cmds"]),  # a status shows budgets as the ledger commands do
        (["cancel", "2"], ["service_cmds"]),
        (["submit", "count.json"], ["submit_cmds"]),  # Typer builds no other scheduler command's options
    ],
)
def test_a_ledger_or_queue_command_loads_only_its_modules_and_nothing_heavy(database, args, modules):
    outcome = probe(*args, "--db", database, cwd=database.parent)
    assert outcome == {"code": 0, "loaded": modules}


@pytest.fixture(scope="module")
def settled(tmp_path_factory) -> Path:
    """A database with an RDP and a basic dataset, blocks, and one pipeline that has ended
    (cancelled): nothing waits, so ``list`` has no pending pipeline to rank."""
    folder = tmp_path_factory.mktemp("settled")
    db = folder / "p.db"
    spec = folder / "count.json"
    job = {"kind": "statistic", "params": {"query": "count"}}
    spec.write_text(json.dumps({"name": "count", "dataset": "reviews", "blocks": ["d1"], "epsilon": 0.1, "job": job}))
    for args in (
        ["init"],
        ["dataset", "create", "reviews", "--epsilon", "10", "--delta", "1e-7"],
        ["dataset", "create", "counts", "--epsilon", "1", "--delta", "1e-6", "--accounting", "basic"],
        ["blocks", "add", "reviews", "d1", "d2"],
        ["submit", spec],
        ["cancel", "1"],
    ):
        assert probe(*args, "--db", db, cwd=folder)["code"] == 0
    return db


@pytest.mark.parametrize(
    "args",
    [["init"], ["dataset", "list"], ["blocks", "list"], ["blocks", "list", "reviews"], ["list"], ["list", "--state", "cancelled"]],
)
def test_a_command_that_lists_names_and_states_loads_neither_numpy_nor_sqlite_utils(settled, args):
    outcome = probe(*args, "--db", settled, cwd=settled.parent, watch=READ_PATH_HEAVY)
    assert outcome["code"] == 0
    assert [m for m in outcome["loaded"] if m in READ_PATH_HEAVY] == []


@pytest.mark.parametrize(
    "args",
    [
        ["budget", "show"],
        ["audit"],
        ["status", "1"],
        ["list"],
        ["dataset", "create", "more", "--epsilon", "1", "--delta", "1e-6"],
        ["blocks", "add", "reviews", "d3"],
    ],
)
def test_a_command_that_computes_on_budgets_does_not_load_sqlite_utils(database, args):
    outcome = probe(*args, "--db", database, cwd=database.parent, watch=READ_PATH_HEAVY)
    assert outcome["code"] == 0
    assert "sqlite_utils" not in outcome["loaded"]


@pytest.mark.parametrize("args", [["status", "1"], ["list"], ["submit", "count.json"], ["budget", "show"], ["audit"]])
def test_ranking_or_submitting_pending_pipelines_does_not_load_numpy_masked_arrays(database, args):
    """``np.unique`` without indices loads ``numpy.ma`` (about 40 ms): the pending view, the
    waiting reasons and a submission take the distinct values with ``set``."""
    outcome = probe(*args, "--db", database, cwd=database.parent, watch=("numpy", "numpy.ma"))
    assert outcome["code"] == 0
    assert outcome["loaded"][0] == "numpy"
    assert "numpy.ma" not in outcome["loaded"]


def test_cancelling_a_pending_pipeline_loads_neither_numpy_nor_sqlite_utils(database):
    """Nothing is allocated to a pending pipeline: its cancellation moves no budget."""
    outcome = probe("cancel", "1", "--db", database, cwd=database.parent, watch=READ_PATH_HEAVY)
    assert outcome == {"code": 0, "loaded": ["service_cmds"]}


def test_help_lists_every_command_without_heavy_imports(tmp_path):
    outcome = probe("--help", cwd=tmp_path)
    assert outcome == {"code": 0, "loaded": list(COMMAND_MODULES)}


def test_a_misspelt_command_is_a_usage_error_suggesting_the_right_one(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "privsched", "sumbit"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "error: No such command 'sumbit'. Did you mean 'submit'?"


#: What a command module may name from the ledger package: its data classes, never its machinery.
LEDGER_DATA = {"PipelineInfo", "BlockInfo", "DatasetInfo", "AuditReport", "Event", "PipelineState"}


def test_commands_reach_the_ledger_only_through_a_client():
    """No command module opens a ledger or its identities: each calls a client method."""
    for path in sorted((REPO / "privsched" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("privsched.ledger"):
                assert node.module == "privsched.ledger" and {a.name for a in node.names} <= LEDGER_DATA, (
                    f"{path.name}:{node.lineno} imports {node.module}"
                )
            assert not (isinstance(node, ast.Name) and node.id in ("Ledger", "Identities")), f"{path.name}:{node.lineno} names {node.id}"


#: Runs ``privsched <argv>`` through ``main`` as a host (see :data:`PROBE`) and prints the
#: threads of NumPy's OpenBLAS.
BLAS_PROBE = """
import json, sys
from privsched import cli
from threadpoolctl import threadpool_info
sys.argv = ["privsched", *sys.argv[1:]]
try:
    cli.main()
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "threads": [p["num_threads"] for p in threadpool_info() if p["internal_api"] == "openblas"]}))
"""


@pytest.mark.parametrize("args", [["status", "1"], ["list"], ["submit", "count.json"], ["budget", "show"], ["audit"]])
@pytest.mark.parametrize(("user", "threads"), [(None, 1), ("2", 2)])
def test_a_command_that_computes_on_budgets_loads_numpy_with_one_blas_thread_unless_the_user_set_it(database, args, user, threads):
    env = {k: v for k, v in os.environ.items() if k not in ("PRIVSCHED_DB", "OPENBLAS_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    if user is not None:
        env["OPENBLAS_NUM_THREADS"] = user
    argv = [sys.executable, "-c", BLAS_PROBE, *args, "--db", str(database)]
    result = subprocess.run(argv, cwd=database.parent, env=env, capture_output=True, text=True)
    assert json.loads(result.stdout.splitlines()[-1]) == {"code": 0, "threads": [threads]}


@pytest.mark.parametrize(("user", "threads"), [(None, 1), ("2", 2)])
def test_simulate_loads_numpy_with_one_blas_thread_unless_the_user_set_it(tmp_path, user, threads):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(REPO)
    if user is not None:
        env["OPENBLAS_NUM_THREADS"] = user
    argv = [sys.executable, "-c", BLAS_PROBE, "simulate", "single-block", "--policy", "dpf-n", "--n", "10", "--out", "run"]
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert json.loads(result.stdout.splitlines()[-1]) == {"code": 0, "threads": [threads]}, result.stderr
