"""Every error privsched raises on purpose, under one base class (docs/design.md §6.3).

A :class:`PrivschedError` is a refusal the caller can act on: its message is one line,
and its ``status`` is the HTTP-like code an API answers with. The command line prints it as
``error: <message>`` (exit status 1); any other exception is a bug in privsched and shows
as one (a traceback), never as bad input. Refusals leave every state unchanged.

The pure layers (``budgets``, ``policies``) raise :class:`BadInput` or plain ``ValueError``
for values outside their domain; :class:`BadInput` is a ``ValueError`` so that both read
the same to a caller.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


def one_line(message: object) -> str:
    """Collapse a (possibly multi-line) message onto one line, its lines joined by "; "."""
    parts = [part.strip() for part in str(message).splitlines() if part.strip()]
    return "; ".join(parts) if parts else "unknown error"


def validation_message(exc: ValidationError) -> str:
    """One line naming every invalid field of a pydantic error: ``field.sub: message; …``
    (pydantic's "Value error, " prefix dropped, repeated lines kept once)."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return one_line("; ".join(dict.fromkeys(parts)))


class PrivschedError(Exception):
    """A request privsched refused; the message is one line."""

    status: int = 400  # per class; a remote client's error keeps the status the server answered

    def __init__(self, message: object = "") -> None:
        super().__init__(one_line(message))


class BadInput(PrivschedError, ValueError):
    """A value, file or request that is malformed or out of range."""

    status = 400


class Forbidden(PrivschedError, PermissionError):
    """An action the caller may not take (a job reading a block outside its grant)."""

    status = 403


class NotFound(PrivschedError, LookupError):
    """A dataset, block, pipeline or file that does not exist."""

    status = 404


class Conflict(PrivschedError):
    """A request at odds with the current state (a second scheduler, a finished pipeline)."""

    status = 409


class BudgetRefused(PrivschedError):
    """A demand the privacy budget cannot hold: beyond a block's capacity, or not the curve
    of the mechanism it claims (docs/design.md §3.3)."""

    status = 422
