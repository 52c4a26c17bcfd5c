"""A code job is checked when it is submitted, free of charge: its file exists, it imports in
a process confined as the job will be (no data), it defines the named function of one
argument, and its paths are stored absolute and kept away from the ledger and the data;
otherwise one line, exit 1, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

import privsched as ps
from privsched.ledger import LedgerError
from privsched.service.preflight import overlap
from tests.cli_inprocess import invoke
from tests.conftest import dump_database
from tests.support.blockdata import block_files


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database in ``tmp_path/db`` with an open basic dataset ``d`` (block b0 in ``tmp_path/store``)."""
    path = tmp_path / "db" / "p.db"
    path.parent.mkdir()
    with ps.connect(path) as client:
        client.create_dataset("d", epsilon=1.0, delta=1e-6, accounting="basic")
        client.add_blocks("d", block_files(tmp_path / "store", ["b0"]), unlocked=1.0)
    return path


def code(tmp_path: Path, text: str, folder: str = "code") -> Path:
    """``tmp_path/<folder>/job.py`` holding ``text``."""
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    (where / "job.py").write_text(text)
    return where


def pipeline(tmp_path: Path, function: str, pythonpath: list[str] | None = None) -> Path:
    path = tmp_path / "p.yaml"
    extra = f", pythonpath: {pythonpath}" if pythonpath is not None else ""
    path.write_text(f"name: p\ndataset: d\nblocks: [b0]\nepsilon: 0.1\njob: {{function: '{function}'{extra}}}\n")
    return path


def refused(db: Path, spec: Path, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Submit ``spec`` from ``cwd``: the one error line, the database unchanged."""
    before = dump_database(db)
    monkeypatch.chdir(cwd)
    done = invoke("submit", spec, db=db)
    assert done.code == 1 and done.stdout == "" and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done
    assert dump_database(db) == before
    return done.stderr


GOOD = "def main(ctx):\n    ctx.report_spent(ctx.budget * 0)\n"


def test_a_job_file_that_does_not_exist_is_refused_at_submit_and_nothing_is_written(db: Path, tmp_path: Path, monkeypatch):
    line = refused(db, pipeline(tmp_path, "code/missing.py:main"), tmp_path, monkeypatch)
    assert "the job's file 'code/missing.py' does not exist" in line


def test_a_module_that_does_not_import_is_refused_with_its_error(db: Path, tmp_path: Path, monkeypatch):
    code(tmp_path, "import no_such_module_here\n")
    line = refused(db, pipeline(tmp_path, "job:main", ["code"]), tmp_path, monkeypatch)
    assert "job:main does not import: ModuleNotFoundError: No module named 'no_such_module_here'" in line


def test_a_function_that_is_missing_or_takes_no_single_argument_is_refused(db: Path, tmp_path: Path, monkeypatch):
    code(tmp_path, GOOD + "def two(a, b):\n    pass\n")
    assert "must take one argument" in refused(db, pipeline(tmp_path, "job:two", ["code"]), tmp_path, monkeypatch)
    assert "has no attribute 'absent'" in refused(db, pipeline(tmp_path, "job:absent", ["code"]), tmp_path, monkeypatch)


def test_the_import_runs_confined_and_cannot_read_the_ledger(db: Path, tmp_path: Path, monkeypatch):
    code(tmp_path, f"open({str(db)!r}, 'rb').read(1)\n" + GOOD)
    line = refused(db, pipeline(tmp_path, "job:main", ["code"]), tmp_path, monkeypatch)
    assert "does not import: PermissionError" in line


def test_relative_paths_are_stored_absolute(db: Path, tmp_path: Path, monkeypatch):
    folder = code(tmp_path, GOOD)
    monkeypatch.chdir(tmp_path)
    with ps.connect(db) as client:
        by_path = client.submit(pipeline(tmp_path, "job:main", ["code"]))
        by_file = client.submit(pipeline(tmp_path, "code/job.py:main"))
        assert by_path.info.job["pythonpath"] == [str(folder.resolve())]
        assert by_file.info.job["function"] == f"{folder.resolve() / 'job.py'}:main"


def test_code_beside_the_ledger_or_the_data_is_refused(db: Path, tmp_path: Path, monkeypatch):
    code(tmp_path, GOOD, folder="db/code")  # beneath the database's folder
    assert "lies beneath" in refused(db, pipeline(tmp_path, "job:main", ["db/code"]), tmp_path, monkeypatch)
    code(tmp_path, GOOD, folder="store/data/code")  # beneath the folder holding a block's file
    assert "lies beneath" in refused(db, pipeline(tmp_path, "job:main", ["store/data/code"]), tmp_path, monkeypatch)
    code(tmp_path, GOOD)
    assert "holds" in refused(db, pipeline(tmp_path, "job:main", ["."]), tmp_path, monkeypatch)  # holds them all


def test_a_dry_run_refuses_what_a_submission_would(db: Path, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with ps.connect(db) as client, pytest.raises(LedgerError, match="does not exist"):
        client.dry_run(pipeline(tmp_path, "code/missing.py:main"))


@pytest.mark.parametrize(
    ("root", "protected", "overlaps"),
    [("/a/b", "/a/b", True), ("/a/b/c", "/a/b", True), ("/a", "/a/b", True), ("/a/bc", "/a/b", False), ("/x", "/a/b", False)],
)
def test_paths_overlap_when_one_lies_beneath_the_other(root: str, protected: str, overlaps: bool):
    assert (overlap([root], [protected]) is not None) is overlaps
