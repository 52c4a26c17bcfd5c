"""The one error type a ledger caller can cause."""

from __future__ import annotations


class LedgerError(ValueError):
    """A request the ledger refused; the database is unchanged. The message is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(message: str) -> str:
    """Collapse a (possibly multi-line) message, e.g. a pydantic error, onto one line."""
    parts = [part.strip() for part in str(message).splitlines() if part.strip()]
    return "; ".join(parts) if parts else "unknown error"


class StorageFull(LedgerError):
    """The database could not grow (disk full, or its size limit reached); nothing changed,
    and the same request can succeed once space returns."""
