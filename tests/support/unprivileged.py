"""Running a permission test as a user the file modes restrict, also when the tests run as
root (root ignores file permissions, so a 0400 file or a 0500 folder would not refuse it).

As root, :func:`as_owner` gives the test's folder to the unprivileged user ``nobody`` and runs
the check in a forked child that has dropped to that user (``setgroups``, ``setgid``,
``setuid``), so the case executes instead of being skipped. The folder must be one that user
can reach: :func:`owned_folder` makes it outside pytest's root-only temporary tree."""

from __future__ import annotations

import os
import pickle
import pwd
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

#: The user a root test run drops to.
USER = "nobody"


def _unprivileged() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        return None


#: Permission tests run as the current user, or (as root) as ``nobody``; skipped only where
#: neither restricts file access: as root on a system without that user.
needs_a_restricted_user = pytest.mark.skipif(
    os.geteuid() == 0 and _unprivileged() is None,
    reason=f"running as root without a user {USER!r} to drop to: file permissions do not restrict root",
)


@pytest.fixture
def owned_folder(tmp_path: Path) -> Iterator[Path]:
    """An empty folder the test's user can reach: ``tmp_path`` itself, or as root a fresh
    folder under the system's temporary directory (pytest's own tree is root-only)."""
    if os.geteuid() != 0:
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="privsched-perm-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for path in (folder, *folder.rglob("*")):
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o700)
        shutil.rmtree(folder)


def as_owner(folder: Path, check: Callable[[], T]) -> T:
    """``check()``, run as the owner of the files under ``folder``: the current user, or as
    root ``nobody`` (the folder and everything in it given to that user first, modes kept).
    The result comes back pickled; an exception in the child is raised here."""
    if os.geteuid() != 0:
        return check()
    user = _unprivileged()
    assert user is not None, "guarded by needs_a_restricted_user"
    for path in (folder, *folder.rglob("*")):
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover -- runs in the child
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            outcome: tuple[bool, object] = (True, check())
        except BaseException as exc:  # noqa: BLE001 -- handed to the parent
            outcome = (False, exc)
        with os.fdopen(write, "wb") as pipe:
            pickle.dump(outcome, pipe)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        ok, value = pickle.load(pipe)
    os.waitpid(child, 0)
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]
