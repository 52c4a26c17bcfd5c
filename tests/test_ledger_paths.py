"""A database path that cannot be used (a symbolic-link loop, a folder privsched may not
write, a read-only file) gets one clear line, a non-zero exit, and nothing is changed.

A read-only bind mount needs privileges; a folder of mode 0500 and a file of mode 0400 take
the same path through the checks. Root ignores file permissions, so those cases are skipped
(with the reason) when the tests run as root."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from privsched.ledger import Ledger, LedgerError
from tests.cli_inprocess import invoke
from tests.conftest import dump_database

ROOT_SKIP = pytest.mark.skipif(os.geteuid() == 0, reason="running as root: file permissions do not restrict root")
WRITES = (["init"], ["dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6"], ["list"])


def one_line_error(args: list[str], db: Path, reason: str) -> None:
    outcome = invoke(*args, db=db)
    assert outcome.code == 1 and outcome.stdout == "", (args, outcome)
    assert outcome.stderr.startswith("error: ") and outcome.stderr.count("\n") == 1, (args, outcome.stderr)
    assert reason in outcome.stderr, (args, outcome.stderr)


@pytest.fixture
def existing(tmp_path: Path) -> Path:
    """A database with one dataset, in a folder of its own."""
    folder = tmp_path / "ledger"
    folder.mkdir()
    with Ledger.init(folder / "p.db") as ledger:
        ledger.create_dataset("first", 1.0, 1e-6, accounting="basic")
    return folder / "p.db"


@pytest.mark.parametrize("args", WRITES)
def test_a_symbolic_link_loop_as_the_database_is_one_line(tmp_path: Path, args: list[str]):
    loop = tmp_path / "loop.db"
    loop.symlink_to(loop)
    one_line_error(args, loop, "cannot open")
    with pytest.raises(LedgerError, match="cannot open"):
        Ledger(loop)
    assert loop.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["loop.db"]


@ROOT_SKIP
@pytest.mark.parametrize("args", WRITES)
def test_a_database_in_a_folder_privsched_cannot_write_is_one_line_and_unchanged(existing: Path, args: list[str]):
    before = dump_database(existing)
    names = sorted(p.name for p in existing.parent.iterdir())
    existing.parent.chmod(0o500)
    try:
        one_line_error(args, existing, "cannot write to")
    finally:
        existing.parent.chmod(0o700)
    assert dump_database(existing) == before and sorted(p.name for p in existing.parent.iterdir()) == names


@ROOT_SKIP
def test_a_new_database_in_a_folder_privsched_cannot_write_is_one_line(tmp_path: Path):
    folder = tmp_path / "closed"
    folder.mkdir(mode=0o500)
    one_line_error(["init"], folder / "new.db", "cannot write to")
    assert list(folder.iterdir()) == []


@ROOT_SKIP
@pytest.mark.parametrize("args", WRITES)
def test_a_read_only_database_file_is_one_line_and_unchanged(existing: Path, args: list[str]):
    before = dump_database(existing)
    existing.chmod(0o400)
    one_line_error(args, existing, "read-only")
    assert dump_database(existing) == before and stat.S_IMODE(existing.stat().st_mode) == 0o400
