"""A ledger's SQLite connection as the ledger's modules use it: the standard library's
``sqlite3``, with sqlite-utils' table builder loaded only where tables are created.

Reading and moving budget is plain SQL (``execute``, ``query``, ``conn.executemany``), so a
command that opens the ledger does not import sqlite-utils (and with it dateutil, pluggy
and click's own copy), a large part of a read command's start-up (issue 16;
``benchmarks/README.md``). Only creating a new database's schema uses sqlite-utils'
``table(...).create``, which loads it on first use.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlite_utils
    from sqlite_utils.db import Table


class Database:
    """One SQLite connection of a ledger file (opened by
    :func:`~privsched.ledger.connection.open_database`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._builder: sqlite_utils.Database | None = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def query(self, sql: str, params: Sequence[Any] = ()) -> Iterator[dict[str, Any]]:
        """The rows of ``sql`` as dicts keyed by column name."""
        cursor = self.conn.execute(sql, params)
        columns = [column[0] for column in cursor.description]
        for row in cursor:
            yield dict(zip(columns, row))

    def table(self, name: str) -> Table:
        """sqlite-utils' builder of table ``name`` on this connection (schema creation)."""
        if self._builder is None:
            import sqlite_utils

            self._builder = sqlite_utils.Database(self.conn, recursive_triggers=False, execute_plugins=False)
        return self._builder.table(name)

    def close(self) -> None:
        self.conn.close()
