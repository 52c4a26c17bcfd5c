"""Ledger connections for the API's request threads: a pool, each request reading through
a connection no other request uses while it runs.

One connection shared by every request thread serialises their reads behind its lock, and
under the interpreter lock a thread that holds it while waiting to run again keeps all the
others waiting (a lock convoy). With a connection per request, reads of different requests
overlap (a WAL reader never waits for a writer or another reader). A pool rather than one
connection per thread: the server's worker threads come and go, its connections stay (as
many as requests ever ran at once). Nothing is cached across requests beyond what the
ledger caches per connection (datasets, which never change once created).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from privsched.client import Client
from privsched.ledger.identities import Identities
from privsched.server.views import Views


@dataclass(frozen=True)
class Reads:
    """One connection's client, identities, and the views over both."""

    client: Client
    identities: Identities
    views: Views


class ConnectionPool:
    """:class:`Reads` of the database at ``path``, lent to one request at a time."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._path = path
        self._free: list[Reads] = []
        self._opened: list[Reads] = []
        self._lock = threading.Lock()

    @contextmanager
    def reads(self) -> Iterator[Reads]:
        """A free :class:`Reads` (opened if none is free) for the block's duration."""
        with self._lock:
            reads = self._free.pop() if self._free else None
        if reads is None:
            reads = self._open()
        try:
            yield reads
        finally:
            with self._lock:
                self._free.append(reads)

    def _open(self) -> Reads:
        client = Client(self._path, create=False)
        client.ledger  # noqa: B018 -- open now, outside the request's timing of its first read
        identities = Identities(self._path)
        reads = Reads(client, identities, Views(client, identities))
        with self._lock:
            self._opened.append(reads)
        return reads

    def close(self) -> None:
        with self._lock:
            opened, self._opened, self._free = self._opened, [], []
        for reads in opened:
            reads.identities.close()
            reads.client.close()
