"""Helpers every ``privsched`` command module shares: the ``--db`` option, one-line errors,
and the console and table rows that print user text as text.

Rich markup is off on the console, and every table cell goes through :func:`add_row`,
which escapes control characters (:func:`privsched.text.printable`): a name such as
``[/]`` or one holding an escape sequence is shown, never interpreted.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from privsched.text import printable

#: Environment variable naming the database when ``--db`` is not given.
DB_ENV = "PRIVSCHED_DB"
#: Database used when neither ``--db`` nor ``PRIVSCHED_DB`` is given.
DEFAULT_DB = Path("privsched.db")

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar=DB_ENV, help="privsched database file (or set PRIVSCHED_DB).", show_default=True),
]


def make_console(**options: object) -> Console:
    """A console that prints text as given: no markup, no highlighting, no emoji codes."""
    return Console(markup=False, highlight=False, emoji=False, **options)  # type: ignore[arg-type]


console = make_console()


def text(value: object, style: str = "") -> Text:
    """A table cell, title or caption holding ``value`` shown as text (escaped)."""
    return Text(printable(value), style=style)


def add_row(table: Table, *cells: object) -> None:
    """Add a row whose cells are shown as text (a rich renderable is kept as it is)."""
    table.add_row(*(cell if isinstance(cell, Text) else text(cell) for cell in cells))


def say(message: object) -> None:
    """Print one line of output on stdout, user text escaped."""
    print(printable(message), flush=True)


def fail(message: object) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with status 1."""
    line = " ".join(printable(message, keep="\n\t\r").split())
    print(f"error: {line}", file=sys.stderr)
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
