"""Waking a scheduler of this process the moment a submission to its database commits.

A scheduler serving a database in this process (:func:`privsched.service.serve.serve`)
listens on the database's resolved path; the local client and the HTTP API's submission
writer, running in the same process, call :func:`notify` after each submission commits,
so its pass starts at once instead of at the scheduler's next look at the database.
Submissions from other processes are seen through SQLite's ``PRAGMA data_version``
(:class:`privsched.service.serve.ChangeWatcher`).

The other way round, the scheduler calls :func:`changed` after a pass that changed
pipelines' states (a grant, a start, an end), and the HTTP API's waiting requests
(:mod:`privsched.server.watching`), registered with :func:`watch`, look again at once
instead of polling.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

_lock = threading.Lock()
_listeners: dict[Path, set[threading.Event]] = {}
_watchers: dict[Path, set[Callable[[], None]]] = {}


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


def watch(path: str | os.PathLike, callback: Callable[[], None]) -> None:
    """Call ``callback`` (from the scheduler's thread: it must be quick) at every
    :func:`changed` of ``path`` until :func:`unwatch`."""
    with _lock:
        _watchers.setdefault(_key(path), set()).add(callback)


def unwatch(path: str | os.PathLike, callback: Callable[[], None]) -> None:
    with _lock:
        watchers = _watchers.get(_key(path), set())
        watchers.discard(callback)
        if not watchers:
            _watchers.pop(_key(path), None)


def changed(path: str | os.PathLike) -> None:
    """Tell the watchers of ``path`` in this process that pipelines changed state."""
    with _lock:
        watchers = list(_watchers.get(_key(path), ()))
    for callback in watchers:
        callback()
