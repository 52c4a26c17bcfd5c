"""Opening a ledger file durably, and running transactions that never surface SQLITE_BUSY.

Every connection uses WAL journaling (readers never block the writer), ``synchronous=FULL``
(a committed transaction survives power loss), foreign keys, and a busy timeout. Writes
run as ``BEGIN IMMEDIATE`` transactions: the write lock is taken before the first read, so
the checks a transaction makes still hold when it commits. If SQLite still reports the
database busy or locked (busy timeout exceeded under heavy contention, WAL recovery), the
whole transaction is rolled back and rerun, so "database is locked" never reaches a caller.

A database is created readable and writable by its owner only (mode 0600, and so are its
WAL and SHM files, which SQLite creates with the database's mode); opening one that other
users may write warns once per file and process, on stderr.
"""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar


from privsched.ledger.database import Database
from privsched.ledger.errors import LedgerError, StorageFull
from privsched.ledger.schema import APPLICATION_ID, MIGRATES_FROM, SCHEMA_VERSION, create_schema, migrate

T = TypeVar("T")

#: SQLite's "database or disk is full" result code (``sqlite3.SQLITE_FULL`` exists only from
#: Python 3.11 on, as does the error's ``sqlite_errorcode``; on 3.10 neither is there).
SQLITE_FULL = 13

#: SQLite's own wait for a lock, in seconds.
BUSY_TIMEOUT = 30.0
#: How long a transaction is retried after SQLite gave up waiting, in seconds.
RETRY_FOR = 600.0
#: Mode of a new database file (and so of its WAL and SHM files): owner read and write.
PRIVATE_MODE = 0o600
#: SQLite's companion files of a database in WAL mode.
COMPANIONS = ("-wal", "-shm")

_warned: set[Path] = set()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def retrying(action: Callable[[], T]) -> T:
    """Run ``action`` again (after a short random pause) while SQLite reports it busy."""
    deadline = time.monotonic() + RETRY_FOR
    pause = 0.005
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 0.5)


def run_transaction(db: Database, body: Callable[[], T], *, immediate: bool = True) -> T:
    """Run ``body`` as one transaction (``BEGIN IMMEDIATE`` for writes, ``BEGIN`` for
    consistent multi-query reads); roll back on any error; retry the whole transaction
    while the database is busy. SQLite errors other than busy become :class:`LedgerError`
    (:class:`StorageFull` when the database could not grow)."""
    conn = db.conn

    def attempt() -> T:
        conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        try:
            result = body()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    try:
        return retrying(attempt)
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
            raise
        if getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL:
            raise StorageFull(f"database error: {exc}") from exc
        raise LedgerError(f"database error: {exc}") from exc


def locked(lock: threading.RLock, db: Database, step: Callable[..., T], *args: Any, immediate: bool = True) -> T:
    """``step(*args)`` as one transaction on ``db`` (``immediate``: a write), one at a time on
    this connection (:func:`~privsched.ledger.connection.run_transaction` reruns it whole
    while the database is busy)."""
    with lock:
        return run_transaction(db, lambda: step(*args), immediate=immediate)


def open_database(path: Path, *, create: bool) -> Database:
    """Open (and with ``create``, initialise) a privsched database file.

    A missing file without ``create``, a file that is not SQLite, a foreign SQLite
    database or a newer schema raise :class:`LedgerError`; nothing is written to them.
    """
    resolved = _probe(path, create)
    mode = "rwc" if create else "rw"
    new = create and not path.exists()
    if not new:
        warn_if_writable_by_others(path)
    try:
        with _private_files(new):
            conn = sqlite3.connect(
                f"{resolved.as_uri()}?mode={mode}",
                uri=True,
                timeout=BUSY_TIMEOUT,
                isolation_level=None,
                check_same_thread=False,  # the Ledger serialises its transactions with a lock
            )
    except sqlite3.Error as exc:
        raise LedgerError(f"cannot open {path}: {exc}") from exc
    try:
        with _private_files(new):
            _check_or_initialise(conn, path, create)
        if new:
            restrict(path)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        return Database(conn)
    except BaseException:
        conn.close()
        raise


def _probe(path: Path, create: bool) -> Path:
    """The absolute path of a database file that can be opened (or, with ``create``,
    created); otherwise a :class:`LedgerError` of one line naming why: missing (the file, or
    the folder a new one would go in), a folder or another non-regular file, a symbolic-link
    loop, a name too long, a folder or a file privsched may not write, a read-only file
    system."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if not create:
            raise LedgerError(f"no privsched database at {path} (create one with `privsched init`)") from None
        info = None
    except OSError as exc:  # a symbolic-link loop, a name too long, a path through a file
        raise LedgerError(f"cannot open {path}: {exc.strerror}") from None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise LedgerError(f"{path} is a directory, not a privsched database")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise LedgerError(f"{path} is not a regular file, not a privsched database")
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:  # a loop among the folders of the path
        raise LedgerError(f"cannot open {path}: {exc}") from None
    folder = resolved.parent
    if not _exists(folder):
        raise LedgerError(f"cannot open {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        why = "a read-only file system" if _read_only(folder) else "a folder privsched cannot write to"
        raise LedgerError(f"cannot open {path}: {folder} is {why} (the ledger writes its journal next to it)")
    if info is not None and not os.access(resolved, os.R_OK | os.W_OK):
        why = "on a read-only file system" if _read_only(resolved) else f"read-only for privsched (mode {stat.S_IMODE(info.st_mode):04o})"
        raise LedgerError(f"cannot open {path}: the file is {why}; every command may write to the ledger")
    return resolved


def _exists(folder: Path) -> bool:
    """Whether ``folder`` exists (one privsched may not look into counts as existing: the
    write check that follows names it)."""
    try:
        os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        pass  # it exists, but privsched may not look into it
    return True


def _read_only(path: Path) -> bool:
    """Whether ``path`` lies on a file system mounted read-only."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@contextmanager
def _private_files(active: bool) -> Iterator[None]:
    """While creating a database, files are created without any group or other access.
    (The umask is per process; creation is brief and happens before any job starts.)"""
    if not active:
        yield
        return
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)


def restrict(path: Path) -> None:
    """Make a database we created, and its WAL/SHM files, owner-only (0600)."""
    for name in ("", *COMPANIONS):
        file = Path(f"{path}{name}")
        if file.exists():
            file.chmod(PRIVATE_MODE)


def warn_if_writable_by_others(path: Path) -> None:
    """One stderr line, once per file and process, when group or other may write the database
    or its WAL/SHM files (anyone who can write them can rewrite the ledger)."""
    resolved = path.resolve()
    if resolved in _warned:
        return
    for name in ("", *COMPANIONS):
        try:
            mode = os.stat(f"{path}{name}").st_mode
        except OSError:
            continue
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            _warned.add(resolved)
            print(
                f"warning: {path}{name} is writable by other users (mode {stat.S_IMODE(mode):04o}); "
                f"run `chmod 600 {path}*` to make the ledger private",
                file=sys.stderr,
            )
            return


def _check_or_initialise(conn: sqlite3.Connection, path: Path, create: bool) -> None:
    def header() -> tuple[int, int, int]:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        return app_id, version, tables

    try:
        app_id, version, tables = retrying(header)
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"{path} is not a privsched database ({exc})") from exc
    if app_id == APPLICATION_ID:
        if MIGRATES_FROM <= version < SCHEMA_VERSION:
            _upgrade(conn)
            version = SCHEMA_VERSION
        if version < SCHEMA_VERSION:
            raise LedgerError(
                f"{path} has the older ledger schema version {version} (no hash-chained event log); this "
                f"privsched reads only version {SCHEMA_VERSION}: create a new database with `privsched init`"
            )
        if version != SCHEMA_VERSION:
            raise LedgerError(f"{path} has ledger schema version {version}; this privsched reads version {SCHEMA_VERSION}")
        if retrying(lambda: conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
            retrying(lambda: conn.execute("PRAGMA journal_mode = WAL"))
        return
    if app_id != 0 or version != 0 or tables != 0:
        raise LedgerError(f"{path} is not a privsched database (a foreign SQLite file)")
    if not create:
        raise LedgerError(f"{path} is an empty file, not a privsched database (run `privsched init`)")
    _initialise(conn)


def _upgrade(conn: sqlite3.Connection) -> None:
    """Migrate an older schema in place (:func:`~privsched.ledger.schema.migrate`); safe
    against a concurrent upgrader."""
    db = Database(conn)

    def step() -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:  # another process may have upgraded it while we waited
            migrate(db, version)

    run_transaction(db, step)


def _initialise(conn: sqlite3.Connection) -> None:
    """Create the schema in an empty file; safe against a concurrent initialiser."""
    retrying(lambda: conn.execute("PRAGMA journal_mode = WAL"))
    db = Database(conn)

    def body() -> None:
        # Another process may have initialised the file while we waited for the lock.
        if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            create_schema(db)

    run_transaction(db, body)
