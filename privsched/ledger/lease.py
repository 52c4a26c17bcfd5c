"""The scheduler lease: at most one scheduler moves budget for a database at a time.

The lease is one row (holder, pid, host, expiry, generation). It can be taken when free,
expired, or held by a process of this host that no longer exists; its holder renews it
(which succeeds as long as nobody else has taken it since). Expiry alone cannot stop a
holder that was paused past its lease (a GC pause, a stopped VM, SIGSTOP) from acting once
it resumes, so every take increments the lease's generation, and the ledger runs each write
of a lease holder behind a fence (:func:`check_fence`, inside the write's own transaction):
a write made with any generation but the current one is refused. This is the fencing token
of Kleppmann, "How to do distributed locking" (2016), in the style of Chubby's sequencers
(Burrows, OSDI 2006). Releasing the lease keeps its row (expired), so generations only grow.
"""

from __future__ import annotations

import os
import socket

from privsched.ledger.database import Database

_NAME = "scheduler"


class LeaseLost(RuntimeError):
    """A lease holder's write was refused: another scheduler has taken the lease since."""


def pid_exists(pid: int) -> bool:
    """Whether a process with this id exists on this host (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current(db: Database) -> dict | None:
    rows = list(db.query("SELECT holder, pid, host, acquired_at, expires_at, generation FROM lease WHERE name = ?", [_NAME]))
    return rows[0] if rows else None


def is_free(row: dict | None, holder: str, now: float) -> bool:
    """Whether ``holder`` may take the lease described by ``row``."""
    if row is None or row["holder"] == holder or row["expires_at"] <= now:
        return True
    return row["host"] == socket.gethostname() and not pid_exists(row["pid"])


def take(db: Database, holder: str, ttl: float, now: float) -> int:
    """Take the lease with the next generation; returns that generation."""
    row = current(db)
    generation = (row["generation"] if row else 0) + 1
    db.execute(
        "INSERT OR REPLACE INTO lease (name, holder, pid, host, acquired_at, expires_at, generation) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [_NAME, holder, os.getpid(), socket.gethostname(), now, now + ttl, generation],
    )
    return generation


def renew(db: Database, holder: str, ttl: float, now: float) -> bool:
    cursor = db.execute(
        "UPDATE lease SET expires_at = ?, pid = ? WHERE name = ? AND holder = ?",
        [now + ttl, os.getpid(), _NAME, holder],
    )
    return cursor.rowcount == 1


def drop(db: Database, holder: str) -> None:
    """Hand the lease back: it expires now, and keeps its generation."""
    db.execute("UPDATE lease SET expires_at = 0 WHERE name = ? AND holder = ?", [_NAME, holder])


def check_fence(db: Database, holder: str, generation: int) -> None:
    """Raise :class:`LeaseLost` unless ``holder`` still holds the lease at ``generation``
    (call inside the write transaction that the fence guards)."""
    found = db.execute("SELECT holder, generation FROM lease WHERE name = ?", [_NAME]).fetchone()
    if found != (holder, generation):
        row = current(db)
        now_held = "nobody" if row is None else f"generation {row['generation']} (pid {row['pid']} on {row['host']})"
        raise LeaseLost(f"refused a write of scheduler lease generation {generation}: the lease is now held by {now_held}")
