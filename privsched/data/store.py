"""The block store: the folder where privsched keeps the blocks it imported (docs/design.md §9).

By default ``<db>.blocks/`` beside the database. The folder is created ``0700`` and every
block file ``0600``; a block is written once, as ``<sha256>.parquet`` (its name is its
content), and never rewritten: a file is linked into place only if no file of that name
exists. An import writes into a private ``.incoming-*`` folder inside the store first, and
that folder is removed whatever happens, so a failed import leaves no partial file.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from privsched.errors import BadInput
from privsched.ledger.fingerprints import file_sha256

#: Suffix of the default block store's folder, after the database's file name.
SUFFIX = ".blocks"


def default_store(database: str | os.PathLike) -> Path:
    """``<db>.blocks`` beside the database."""
    return Path(str(Path(database).absolute()) + SUFFIX)


def _fsync(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlockStore:
    """One store folder: where imports stage their files and seal their blocks."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder).absolute()

    def open(self) -> None:
        """Create the folder ``0700`` if it does not exist; an existing one must be a folder
        that only its owner may enter."""
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            mode = self.folder.stat().st_mode & 0o777
        except OSError as exc:
            raise BadInput(f"block store {self.folder}: {exc.strerror or exc}") from None
        if not self.folder.is_dir():
            raise BadInput(f"block store {self.folder}: not a folder")
        if mode & 0o077:
            raise BadInput(f"block store {self.folder} may be read by other users (mode {mode:04o}); run `chmod 700 {self.folder}`")

    @contextmanager
    def incoming(self) -> Iterator[Path]:
        """A private staging folder in the store, removed on leaving (whatever happens)."""
        self.open()
        staging = self.folder / f".incoming-{secrets.token_hex(8)}"
        staging.mkdir(mode=0o700)
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock (``.lock``, an exclusive ``flock``): imports seal, register
        and clean up one at a time, so a refused import never removes a file that another
        import with the same content has just registered."""
        fd = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def path_of(self, sha256: str) -> Path:
        return self.folder / f"{sha256}.parquet"

    def seal(self, staged: Path, sha256: str) -> tuple[Path, bool]:
        """Put a staged block file in place as ``<sha256>.parquet`` (``0600``, its content
        synced; :meth:`sync` then syncs the folder): ``(its path, True)``, or ``(its path,
        False)`` when a file with that content is already there (left as it is: a store file
        is never rewritten)."""
        final = self.path_of(sha256)
        os.chmod(staged, 0o600)
        _fsync(staged)
        try:
            os.link(staged, final)
        except FileExistsError:
            if file_sha256(final) != sha256:
                raise BadInput(f"block store file {final} does not hold what its name says; run `privsched audit`") from None
            return final, False
        return final, True

    def sync(self) -> None:
        """Make the files sealed so far durable in the folder (one sync of its entries)."""
        _fsync(self.folder)

    @staticmethod
    def remove(paths: list[Path]) -> None:
        """Remove files sealed by an import that was then refused."""
        for path in paths:
            path.unlink(missing_ok=True)
