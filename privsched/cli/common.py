"""Helpers every ``privsched`` command module shares: the ``--db`` option, one-line errors,
and the rich console for tables."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

#: Environment variable naming the database when ``--db`` is not given.
DB_ENV = "PRIVSCHED_DB"
#: Database used when neither ``--db`` nor ``PRIVSCHED_DB`` is given.
DEFAULT_DB = Path("privsched.db")

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar=DB_ENV, help="privsched database file (or set PRIVSCHED_DB).", show_default=True),
]

console = Console()


def fail(message: object) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with status 1."""
    text = " ".join(str(message).split())
    print(f"error: {text}", file=sys.stderr)
    raise typer.Exit(1)


@contextmanager
def errors() -> Iterator[None]:
    """Turn a refusal raised inside into :func:`fail`: a
    :class:`~privsched.errors.PrivschedError`, or a ``ValueError`` from the pure layers'
    range checks (docs/design.md §6.3). Anything else propagates: it is a bug."""
    from privsched.errors import PrivschedError

    try:
        yield
    except (PrivschedError, ValueError) as exc:
        fail(exc)
