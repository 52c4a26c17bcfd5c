"""Keeping a job's log bounded while the job still writes to it.

A job writes its stdout and stderr to its log through a descriptor opened with
``O_APPEND``, so every write goes to the file's current end. When the log grows past its
limit, :func:`cap_log` moves the last ``keep`` bytes to the start of the same file (the
same inode, so the job's descriptor stays valid) after a line saying how much was dropped,
and truncates the rest: the log keeps its tail, where a job's error is. Bytes the job
appends while the tail is being moved may be lost; the limit holds to within what a job
writes between two calls.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Size past which a job's log is cut, and how much of its tail is kept, in bytes.
LOG_LIMIT = 16 * 2**20
LOG_KEEP = 8 * 2**20


def cap_log(path: Path, limit: int = LOG_LIMIT, keep: int = LOG_KEEP) -> int:
    """Cut the log at ``path`` to its last ``keep`` bytes if it is larger than ``limit``;
    return the number of bytes dropped (0 when it was small enough or is missing)."""
    if not 0 < keep <= limit:
        raise ValueError(f"need 0 < keep <= limit, got keep={keep}, limit={limit}")
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size <= limit:
            return 0
        tail = os.pread(fd, keep, size - keep)
        newline = tail.find(b"\n")
        if 0 <= newline < len(tail) - 1:
            tail = tail[newline + 1 :]  # start on a whole line
        dropped = size - len(tail)
        data = f"[privsched: {dropped} earlier bytes of this log were dropped]\n".encode() + tail
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        return dropped
    finally:
        os.close(fd)
