"""The one error type a ledger caller can cause."""

from __future__ import annotations

from privsched.errors import BadInput, one_line

__all__ = ["LedgerError", "one_line"]


class LedgerError(BadInput):
    """A request the ledger refused; the database is unchanged. The message is one line."""
