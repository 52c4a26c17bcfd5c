"""The error types a ledger caller can cause."""

from __future__ import annotations

from privsched.errors import BadInput, one_line

__all__ = ["LedgerError", "StorageFull", "one_line"]


class LedgerError(BadInput):
    """A request the ledger refused; the database is unchanged. The message is one line."""


class StorageFull(LedgerError):
    """The database could not grow (disk full, or its size limit reached); nothing changed,
    and the same request can succeed once space returns."""
