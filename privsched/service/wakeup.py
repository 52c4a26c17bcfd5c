"""Waking a scheduler of this process the moment a submission to its database commits.

A scheduler serving a database in this process (:func:`privsched.service.serve.serve`)
listens on the database's resolved path; the local client and the HTTP API's submission
writer, running in the same process, call :func:`notify` after each submission commits,
so its pass starts at once instead of at the scheduler's next look at the database.
Submissions from other processes are seen through SQLite's ``PRAGMA data_version``
(:class:`privsched.service.serve.ChangeWatcher`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_lock = threading.Lock()
_listeners: dict[Path, set[threading.Event]] = {}


def _key(path: str | os.PathLike) -> Path:
    return Path(path).resolve()


def listen(path: str | os.PathLike) -> threading.Event:
    """An event set by every :func:`notify` of ``path`` until :func:`unlisten`."""
    event = threading.Event()
    with _lock:
        _listeners.setdefault(_key(path), set()).add(event)
    return event


def unlisten(path: str | os.PathLike, event: threading.Event) -> None:
    with _lock:
        listeners = _listeners.get(_key(path), set())
        listeners.discard(event)
        if not listeners:
            _listeners.pop(_key(path), None)


def notify(path: str | os.PathLike) -> None:
    """Wake every scheduler of this process that serves the database at ``path``."""
    with _lock:
        listeners = list(_listeners.get(_key(path), ()))
    for event in listeners:
        event.set()
