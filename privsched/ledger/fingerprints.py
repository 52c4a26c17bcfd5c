"""Fingerprints of block data: the SHA-256 of a block's file (or of a folder's files) taken
when the block is created, and the check, by ``audit`` and before each job, that the data
is still what was registered (docs/design.md §9).

A folder's fingerprint is the SHA-256 of, for each regular file below it in sorted order of
its relative path: the path (UTF-8), a NUL byte, and the file's own SHA-256 (32 bytes). An
empty folder's is then the SHA-256 of no bytes, as an empty file's is.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

from privsched.ledger.errors import LedgerError
from privsched.ledger.models import EMPTY_SHA256

#: Bytes read per call while hashing.
CHUNK = 1 << 20

#: Fingerprints already taken, by (path, device, inode, size, mtime, ctime): a file whose
#: status is unchanged is not hashed again (its ctime moves on every change of its content,
#: and no user can set it back).
_seen: dict[tuple, str] = {}
_seen_lock = threading.Lock()


def file_sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of one file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _identity(path: str, info: os.stat_result) -> tuple:
    return (path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _cached_file_sha256(path: str) -> str:
    info = os.stat(path)
    identity = _identity(path, info)
    with _seen_lock:
        known = _seen.get(identity)
    if known is not None:
        return known
    value = file_sha256(path)
    if _identity(path, os.stat(path)) == identity:  # unchanged while it was read
        with _seen_lock:
            _seen[identity] = value
    return value


def location_sha256(location: str | os.PathLike) -> str:
    """The fingerprint of a file, or of a folder's files (module docstring)."""
    path = os.fspath(location)
    if not stat.S_ISDIR(os.stat(path).st_mode):
        return _cached_file_sha256(path)
    digest = hashlib.sha256()
    files: list[str] = []
    for folder, subfolders, names in os.walk(path):
        subfolders.sort()
        files.extend(os.path.join(folder, name) for name in names if stat.S_ISREG(os.lstat(os.path.join(folder, name)).st_mode))
    for file in sorted(files, key=lambda f: os.path.relpath(f, path)):
        digest.update(os.path.relpath(file, path).encode("utf-8", "surrogateescape") + b"\0")
        digest.update(bytes.fromhex(_cached_file_sha256(file)))
    return digest.hexdigest()


def fingerprint(location: str, key: str) -> str:
    """The fingerprint of block ``key``'s data at ``location``; a location that cannot be
    read raises :class:`LedgerError` naming the block."""
    try:
        return location_sha256(location)
    except OSError as exc:
        raise LedgerError(f"the data location of block {key!r} cannot be read: {location!r} ({exc.strerror or exc})") from None


def data_problem(location: str | None, sha256: str | None) -> str | None:
    """Why a block's data is no longer what was registered (missing, unreadable, changed), or
    None when its fingerprint still matches (or it has none). A block registered empty lost
    no records when its location went away; data appearing there later is a change."""
    if location is None or sha256 is None:
        return None
    if not Path(location).exists():
        return None if sha256 == EMPTY_SHA256 else f"its data is missing ({location})"
    try:
        now = location_sha256(location)
    except OSError as exc:
        return f"its data cannot be read ({location}: {exc.strerror or exc})"
    if now != sha256:
        return f"its data changed since it was registered ({location}: sha256 {now[:16]}…, registered {sha256[:16]}…)"
    return None
