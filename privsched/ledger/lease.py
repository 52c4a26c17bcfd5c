"""The scheduler lease: at most one scheduler moves budget for a database at a time.

The lease is one row (holder, pid, host, expiry). It can be taken when free, expired, or
held by a process of this host that no longer exists; its holder renews it (which
succeeds as long as nobody else has taken it since).
"""

from __future__ import annotations

import os
import socket

import sqlite_utils

_NAME = "scheduler"


def pid_exists(pid: int) -> bool:
    """Whether a process with this id exists on this host (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current(db: sqlite_utils.Database) -> dict | None:
    rows = list(db.query("SELECT holder, pid, host, acquired_at, expires_at FROM lease WHERE name = ?", [_NAME]))
    return rows[0] if rows else None


def is_free(row: dict | None, holder: str, now: float) -> bool:
    """Whether ``holder`` may take the lease described by ``row``."""
    if row is None or row["holder"] == holder or row["expires_at"] <= now:
        return True
    return row["host"] == socket.gethostname() and not pid_exists(row["pid"])


def take(db: sqlite_utils.Database, holder: str, ttl: float, now: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO lease (name, holder, pid, host, acquired_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
        [_NAME, holder, os.getpid(), socket.gethostname(), now, now + ttl],
    )


def renew(db: sqlite_utils.Database, holder: str, ttl: float, now: float) -> bool:
    cursor = db.execute(
        "UPDATE lease SET expires_at = ?, pid = ? WHERE name = ? AND holder = ?",
        [now + ttl, os.getpid(), _NAME, holder],
    )
    return cursor.rowcount == 1


def drop(db: sqlite_utils.Database, holder: str) -> None:
    db.execute("DELETE FROM lease WHERE name = ? AND holder = ?", [_NAME, holder])
