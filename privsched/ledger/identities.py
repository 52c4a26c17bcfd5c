"""Who may use a shared ledger: users with a role, a team and whether they may run code
jobs, their bearer tokens, which teams may read a dataset, and who submitted each pipeline
under which submission id.

Code rights (docs/privacy.md, "Who may run what"): a *code* job (``function:``) runs the
submitter's own Python, trusted to release data only through privsched's primitives, so
only users an admin allowed (:meth:`Identities.allow_code`) may submit one; declarative
jobs (built-in statistics and DP-SGD) are open to every submitter. Every change of a user
(added, revoked, code allowed or denied) is appended to ``user_changes`` with who made it,
a table that refuses updates and deletes.

These live in tables of their own, created on first use (``CREATE TABLE IF NOT EXISTS``)
beside the budget tables, which they never touch. Only the SHA-256 of a token is stored:
a token is 32 bytes from :func:`secrets.token_urlsafe` (the OS's randomness), so the hash
of a stolen database does not let anyone in (a preimage search of 2^256).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from privsched.ledger.database import Database
from privsched.ledger.connection import locked, open_database
from privsched.ledger.errors import LedgerError
from privsched.ledger.models import OPERATOR, SCHEDULER
from privsched.ledger.quotas import TABLE as QUOTA_TABLE

T = TypeVar("T")

#: Roles, from least to most trusted. Viewers read; submitters also submit and manage their
#: own pipelines; admins manage datasets, blocks, users and budget.
ROLES = ("viewer", "submitter", "admin")
#: Prefix of every token, so that a leaked one is recognisable in logs and scanners.
TOKEN_PREFIX = "psk_"
_USER_COLUMNS = "name, role, team, created_at, revoked_at, code"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")

_TABLES = f"""
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, role TEXT NOT NULL, team TEXT, token_hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL, revoked_at REAL, code INTEGER NOT NULL DEFAULT 0) STRICT;
CREATE TABLE IF NOT EXISTS user_changes (
    id INTEGER PRIMARY KEY, at REAL NOT NULL, name TEXT NOT NULL, change TEXT NOT NULL, actor TEXT) STRICT;
CREATE TRIGGER IF NOT EXISTS user_changes_no_update BEFORE UPDATE ON user_changes
    BEGIN SELECT RAISE(ABORT, 'the user changes are append-only'); END;
CREATE TRIGGER IF NOT EXISTS user_changes_no_delete BEFORE DELETE ON user_changes
    BEGIN SELECT RAISE(ABORT, 'the user changes are append-only'); END;
CREATE TABLE IF NOT EXISTS dataset_teams (
    dataset_id INTEGER NOT NULL REFERENCES datasets(id), team TEXT NOT NULL,
    PRIMARY KEY (dataset_id, team)) STRICT;
{QUOTA_TABLE};
CREATE TABLE IF NOT EXISTS submissions (
    pipeline_id INTEGER PRIMARY KEY REFERENCES pipelines(id), submitter TEXT NOT NULL, team TEXT,
    submission_id TEXT UNIQUE) STRICT;
"""


@dataclass(frozen=True)
class User:
    name: str
    role: str  # one of ROLES
    team: str | None  # None: belongs to no team (reads only datasets open to all)
    created_at: float
    revoked_at: float | None = None
    code: bool = False  # may submit code jobs (``function:``); admins always may

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def may_run_code(self) -> bool:
        """Whether this user may submit code jobs: an admin, or a submitter allowed to."""
        return self.is_admin or (self.role == "submitter" and self.code)


@dataclass(frozen=True)
class UserChange:
    """One recorded change of a user: ``added`` (with its role and rights), ``revoked``,
    ``code allowed`` or ``code denied``, by ``actor`` (None: the local operator)."""

    at: float
    name: str
    change: str
    actor: str | None


@dataclass(frozen=True)
class Submission:
    """Who submitted a pipeline, for which team, under which client-chosen id."""

    pipeline_id: int
    submitter: str
    team: str | None
    submission_id: str | None


class DuplicateSubmission(Exception):
    """A submission id already names a pipeline (raised inside the submit transaction,
    which then records nothing)."""

    def __init__(self, pipeline_id: int) -> None:
        super().__init__(f"submission already recorded as pipeline {pipeline_id}")
        self.pipeline_id = pipeline_id


def token_hash(token: str) -> str:
    """The stored form of a bearer token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(text: object, what: str) -> str:
    if not isinstance(text, str) or not _NAME.match(text):
        raise LedgerError(f"{what} must be 1-64 letters, digits or ._@- starting with a letter or digit, got {text!r}")
    return text


class Identities:
    """Users, tokens, dataset teams and submissions of one ledger file (its own connection)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.db = open_database(self.path, create=False)
        self._lock = threading.RLock()
        self._write(_create_tables)

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Identities:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, step: Callable[..., T], *args: Any) -> T:
        """``step(db, *args)`` as one write transaction."""
        return locked(self._lock, self.db, step, self.db, *args)

    def _rows(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        with self._lock:
            return self.db.execute(sql, list(params)).fetchall()

    # ------------------------------------------------------------------------ users
    def add_user(
        self, name: str, role: str, team: str | None = None, now: float | None = None, *, code: bool = False, actor: str | None = None
    ) -> str:
        """Create a user and return its bearer token: shown once, only its hash is kept. The
        names the ledger records for the operator and the scheduler are not user names.
        ``code``: whether it may submit code jobs (a submitter's right; admins always may,
        viewers never); ``actor``: who adds it (None: the local operator)."""
        name = check_name(name, "user name")
        if name in (OPERATOR, SCHEDULER):
            raise LedgerError(f"user name {name!r} is reserved: the event log records the {name} under it")
        if role not in ROLES:
            raise LedgerError(f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
        team = None if team is None else check_name(team, "team name")
        if code and role != "submitter":
            why = "admins always have them" if role == "admin" else "a viewer submits nothing"
            raise LedgerError(f"code rights are a submitter's ({why})")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        at = time.time() if now is None else now
        self._write(_insert_user, name, role, team, token_hash(token), at, code, actor)
        return token

    def users(self) -> list[User]:
        return [_user(row) for row in self._rows(f"SELECT {_USER_COLUMNS} FROM users ORDER BY name")]

    def revoke(self, name: str, now: float | None = None, *, actor: str | None = None) -> None:
        """Revoke a user's token for good (the user stays listed, with when)."""
        self._write(_revoke, name, time.time() if now is None else now, actor)

    def set_code(self, name: str, allowed: bool, now: float | None = None, *, actor: str | None = None) -> User:
        """Allow a submitter to submit code jobs, or deny it again (recorded with ``actor``,
        who made the change); returns the user afterwards."""
        self._write(_set_code, name, allowed, time.time() if now is None else now, actor)
        return next(user for user in self.users() if user.name == name)

    def changes(self, name: str | None = None) -> list[UserChange]:
        """The recorded changes of every user (of ``name`` only, if given), oldest first."""
        where, params = ("WHERE name = ?", [name]) if name is not None else ("", [])
        return [UserChange(*row) for row in self._rows(f"SELECT at, name, change, actor FROM user_changes {where} ORDER BY id", params)]

    def authenticate(self, token: str) -> User | None:
        """The live user holding ``token``, or None (unknown or revoked)."""
        found = self._rows(f"SELECT {_USER_COLUMNS} FROM users WHERE token_hash = ?", [token_hash(token)])
        if not found or found[0][4] is not None:
            return None
        return _user(found[0])

    # --------------------------------------------------------------- dataset teams
    def restrict(self, dataset_id: int, teams: list[str]) -> None:
        """Let only ``teams`` (and admins) read and use a dataset; an empty list opens it to all."""
        names = [check_name(t, "team name") for t in teams]
        self._write(_restrict, dataset_id, sorted(set(names)))

    def dataset_teams(self, dataset_id: int) -> list[str]:
        """Teams allowed on a dataset; empty when it is open to every user."""
        return [t for (t,) in self._rows("SELECT team FROM dataset_teams WHERE dataset_id = ? ORDER BY team", [dataset_id])]

    def may_read(self, user: User, dataset_id: int) -> bool:
        teams = self.dataset_teams(dataset_id)
        return user.is_admin or not teams or user.team in teams

    def set_quota(self, dataset_id: int, team: str, share: float | None) -> None:
        """Cap what ``team`` may hold on each block of a dataset at ``share`` × capacity
        (:mod:`privsched.ledger.quotas`); None lifts the cap."""
        team = check_name(team, "team name")
        if share is not None and not (isinstance(share, (int, float)) and 0 <= share <= 1):
            raise LedgerError(f"a quota share must be a number in [0, 1], got {share!r}")
        self._write(_set_quota, dataset_id, team, None if share is None else float(share))

    def quotas(self, dataset_id: int) -> dict[str, float]:
        return dict(self._rows("SELECT team, share FROM team_quotas WHERE dataset_id = ? ORDER BY team", [dataset_id]))

    # ----------------------------------------------------------------- submissions
    def submission(self, submission_id: str) -> int | None:
        """The pipeline recorded under a client-chosen submission id, if any."""
        found = self._rows("SELECT pipeline_id FROM submissions WHERE submission_id = ?", [submission_id])
        return found[0][0] if found else None

    def submissions(self, pipeline_ids: list[int]) -> dict[int, Submission]:
        if not pipeline_ids:
            return {}
        marks = ",".join("?" * len(pipeline_ids))
        return {
            row[0]: Submission(*row)
            for row in self._rows(
                f"SELECT pipeline_id, submitter, team, submission_id FROM submissions WHERE pipeline_id IN ({marks})", pipeline_ids
            )
        }

    @staticmethod
    def claim(db: Database, entries: list[tuple[User, str | None]]) -> Callable[[list[int]], None]:
        """What :meth:`Ledger.submit_many` runs inside its transaction (on the ledger's
        connection ``db``): record the submitter, team and submission id of each new
        pipeline (``entries``, in order), refusing a submission id already used
        (:class:`DuplicateSubmission`; then nothing is recorded)."""

        def record(ids: list[int]) -> None:
            for _, submission_id in entries:
                if submission_id is None:
                    continue
                found = db.execute("SELECT pipeline_id FROM submissions WHERE submission_id = ?", [submission_id]).fetchone()
                if found is not None:
                    raise DuplicateSubmission(found[0])
            db.conn.executemany(
                "INSERT INTO submissions (pipeline_id, submitter, team, submission_id) VALUES (?, ?, ?, ?)",
                [(i, user.name, user.team, submission_id) for i, (user, submission_id) in zip(ids, entries)],
            )

        return record


def _user(row: tuple) -> User:
    """A :class:`User` from a row of :data:`_USER_COLUMNS`."""
    name, role, team, created_at, revoked_at, code = row
    return User(name, role, team, created_at, revoked_at, bool(code))


# Writes, each run by :meth:`Identities._write` as one transaction on its connection ``db``.
def _create_tables(db: Database) -> None:
    for sql in re.split(r";\n", _TABLES):
        if sql.strip():
            db.execute(sql)
    columns = {row[1] for row in db.execute("PRAGMA table_info(users)").fetchall()}
    if "code" not in columns:  # a users table from before code rights: nobody has them
        db.execute("ALTER TABLE users ADD COLUMN code INTEGER NOT NULL DEFAULT 0")


def _record(db: Database, at: float, name: str, change: str, actor: str | None) -> None:
    db.execute("INSERT INTO user_changes (at, name, change, actor) VALUES (?, ?, ?, ?)", [at, name, change, actor])


def _insert_user(db: Database, name: str, role: str, team: str | None, digest: str, at: float, code: bool, actor: str | None) -> None:
    if db.execute("SELECT 1 FROM users WHERE name = ?", [name]).fetchone():
        raise LedgerError(f"user {name!r} already exists")
    db.execute(
        "INSERT INTO users (name, role, team, token_hash, created_at, code) VALUES (?, ?, ?, ?, ?, ?)",
        [name, role, team, digest, at, int(code)],
    )
    _record(db, at, name, f"added as {role}{f' of team {team}' if team else ''}{', code allowed' if code else ''}", actor)


def _revoke(db: Database, name: str, at: float, actor: str | None) -> None:
    found = db.execute("SELECT revoked_at FROM users WHERE name = ?", [name]).fetchone()
    if found is None:
        raise LedgerError(f"unknown user {name!r}")
    if found[0] is not None:
        raise LedgerError(f"user {name!r} is already revoked")
    db.execute("UPDATE users SET revoked_at = ? WHERE name = ?", [at, name])
    _record(db, at, name, "revoked", actor)


def _set_code(db: Database, name: str, allowed: bool, at: float, actor: str | None) -> None:
    found = db.execute("SELECT role, code FROM users WHERE name = ?", [name]).fetchone()
    if found is None:
        raise LedgerError(f"unknown user {name!r}")
    if found[0] != "submitter":
        what = "an admin, who always may submit code jobs" if found[0] == "admin" else "a viewer, who submits nothing"
        raise LedgerError(f"user {name!r} is {what}")
    if bool(found[1]) == allowed:
        raise LedgerError(f"user {name!r} is already {'allowed' if allowed else 'denied'} code jobs")
    db.execute("UPDATE users SET code = ? WHERE name = ?", [int(allowed), name])
    _record(db, at, name, "code allowed" if allowed else "code denied", actor)


def _restrict(db: Database, dataset_id: int, teams: list[str]) -> None:
    db.execute("DELETE FROM dataset_teams WHERE dataset_id = ?", [dataset_id])
    db.conn.executemany("INSERT INTO dataset_teams (dataset_id, team) VALUES (?, ?)", [(dataset_id, t) for t in teams])


def _set_quota(db: Database, dataset_id: int, team: str, share: float | None) -> None:
    db.execute("DELETE FROM team_quotas WHERE dataset_id = ? AND team = ?", [dataset_id, team])
    if share is not None:
        db.execute("INSERT INTO team_quotas (dataset_id, team, share) VALUES (?, ?, ?)", [dataset_id, team, share])
