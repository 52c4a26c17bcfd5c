"""A database path that cannot be used (a symbolic-link loop, a folder privsched may not
write, a read-only file) gets one clear line, a non-zero exit, and nothing is changed.

A folder of mode 0500 and a file of mode 0400 take the same path through the checks as a
read-only file system (tests/test_faults_readonly.py mounts a real one). Root ignores file
permissions, so under root those cases run as an unprivileged user
(:mod:`tests.support.unprivileged`)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from privsched.ledger import Ledger, LedgerError
from tests.cli_inprocess import invoke
from tests.conftest import dump_database
from tests.support.unprivileged import as_owner, needs_a_restricted_user, owned_folder  # noqa: F401 -- a fixture

WRITES = (["init"], ["dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6"], ["list"])


def one_line_error(args: list[str], db: Path, reason: str) -> None:
    outcome = invoke(*args, db=db)
    assert outcome.code == 1 and outcome.stdout == "", (args, outcome)
    assert outcome.stderr.startswith("error: ") and outcome.stderr.count("\n") == 1, (args, outcome.stderr)
    assert reason in outcome.stderr, (args, outcome.stderr)


@pytest.fixture
def existing(owned_folder: Path) -> Path:  # noqa: F811 -- the fixture
    """A database with one dataset, in a folder of its own."""
    folder = owned_folder / "ledger"
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


@needs_a_restricted_user
@pytest.mark.parametrize("args", WRITES)
def test_a_database_in_a_folder_privsched_cannot_write_is_one_line_and_unchanged(existing: Path, args: list[str]):
    before = dump_database(existing)
    names = sorted(p.name for p in existing.parent.iterdir())
    existing.parent.chmod(0o500)
    try:
        as_owner(existing.parent, lambda: one_line_error(args, existing, "cannot write to"))
    finally:
        existing.parent.chmod(0o700)
    assert dump_database(existing) == before and sorted(p.name for p in existing.parent.iterdir()) == names


@needs_a_restricted_user
def test_a_new_database_in_a_folder_privsched_cannot_write_is_one_line(owned_folder: Path):  # noqa: F811
    folder = owned_folder / "closed"
    folder.mkdir(mode=0o500)
    as_owner(folder, lambda: one_line_error(["init"], folder / "new.db", "cannot write to"))
    assert list(folder.iterdir()) == []


@needs_a_restricted_user
@pytest.mark.parametrize("args", WRITES)
def test_a_read_only_database_file_is_one_line_and_unchanged(existing: Path, args: list[str]):
    before = dump_database(existing)
    existing.chmod(0o400)
    as_owner(existing.parent, lambda: one_line_error(args, existing, "read-only"))
    assert dump_database(existing) == before and stat.S_IMODE(existing.stat().st_mode) == 0o400


@pytest.mark.parametrize("args", WRITES)
def test_a_symbolic_link_loop_among_the_folders_is_one_line(tmp_path: Path, args: list[str]):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    one_line_error(args, tmp_path / "loop" / "p.db", "cannot open")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


def test_a_new_database_in_a_folder_that_does_not_exist_names_the_folder(tmp_path: Path):
    one_line_error(["init"], tmp_path / "missing" / "p.db", f"the folder {tmp_path / 'missing'} does not exist")
    assert list(tmp_path.iterdir()) == []


def test_a_dangling_link_into_a_missing_folder_names_the_missing_folder(tmp_path: Path):
    (tmp_path / "p.db").symlink_to(tmp_path / "gone" / "p.db")
    one_line_error(["init"], tmp_path / "p.db", f"the folder {tmp_path / 'gone'} does not exist")
    with pytest.raises(LedgerError, match="does not exist"):
        Ledger.init(tmp_path / "p.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.db"]
