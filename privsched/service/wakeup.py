"""Waking a scheduler of this process the moment a submission to its database commits.

A scheduler serving a database in this process (:func:`privsched.service.serve.serve`)
listens on the database's resolved path; the local client and the HTTP API's submission
writer, running in the same process, call :func:`notify` after each submission commits,
so its pass starts at once instead of at the scheduler's next look at the database.
Submissions from other processes are seen through SQLite's ``PRAGMA data_version``
(:class:`privsched.service.serve.ChangeWatcher`).

The other way round, the scheduler calls :func:`changed` after a pass that changed
pipelines' states (a grant, a start, an end), naming those pipelines, and the HTTP API's
waiting requests (:mod:`privsched.server.watching`), registered with :func:`watch`, on
those pipelines look again at once instead of polling.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: The pipelines whose state changed; None when any may have.
Changed = frozenset[int] | None

_lock = threading.Lock()
Registry = dict[Path, set[Callable[..., None]]]
_listeners: Registry = {}  # per database: the ``set`` of each scheduler's event (notify)
_watchers: Registry = {}  # per database: the HTTP API's callbacks (changed)


def _key(path: str | os.PathLike) -> Path:
    return Path(path).resolve()


def _add(registry: Registry, path: str | os.PathLike, callback: Callable[..., None]) -> None:
    with _lock:
        registry.setdefault(_key(path), set()).add(callback)


def _discard(registry: Registry, path: str | os.PathLike, callback: Callable[..., None]) -> None:
    with _lock:
        callbacks = registry.get(_key(path), set())
        callbacks.discard(callback)
        if not callbacks:
            registry.pop(_key(path), None)


def _call(registry: Registry, path: str | os.PathLike, *args: Any) -> None:
    with _lock:
        callbacks = list(registry.get(_key(path), ()))
    for callback in callbacks:
        callback(*args)


def listen(path: str | os.PathLike) -> threading.Event:
    """An event set by every :func:`notify` of ``path`` until :func:`unlisten`."""
    event = threading.Event()
    _add(_listeners, path, event.set)
    return event


def unlisten(path: str | os.PathLike, event: threading.Event) -> None:
    _discard(_listeners, path, event.set)


def notify(path: str | os.PathLike) -> None:
    """Wake every scheduler of this process that serves the database at ``path``."""
    _call(_listeners, path)


def watch(path: str | os.PathLike, callback: Callable[[Changed], None]) -> None:
    """Call ``callback`` with the pipelines that changed (from the scheduler's thread: it
    must be quick) at every :func:`changed` of ``path`` until :func:`unwatch`."""
    _add(_watchers, path, callback)


def unwatch(path: str | os.PathLike, callback: Callable[[Changed], None]) -> None:
    _discard(_watchers, path, callback)


def changed(path: str | os.PathLike, pipelines: Iterable[int] | None = None) -> None:
    """Tell the watchers of ``path`` in this process that ``pipelines`` (None: any)
    changed state."""
    _call(_watchers, path, None if pipelines is None else frozenset(pipelines))
