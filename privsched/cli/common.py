"""Helpers every ``privsched`` command module shares: the ``--db`` option, one-line errors,
and the console and table rows that print user text as text.

Rich markup is off on the console, and every table cell goes through :func:`add_row`,
which escapes control characters (:func:`privsched.text.printable`): a name such as
``[/]`` or one holding an escape sequence is shown, never interpreted. Rich is imported
when a command first builds a table or prints to :data:`console`, so that a command that
prints a line does not pay for it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from privsched.text import printable

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table
    from rich.text import Text

#: Environment variable naming the database when ``--db`` is not given.
DB_ENV = "PRIVSCHED_DB"
#: Database used when neither ``--db`` nor ``PRIVSCHED_DB`` is given.
DEFAULT_DB = Path("privsched.db")

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar=DB_ENV, help="privsched database file (or set PRIVSCHED_DB).", show_default=True),
]


def make_console(**options: Any) -> Console:
    """A console that prints text as given: no markup, no highlighting, no emoji codes."""
    from rich.console import Console

    return Console(markup=False, highlight=False, emoji=False, **options)


@cache
def _console() -> Console:
    return make_console()


def __getattr__(name: str) -> Any:
    """``console``: the shared console of :func:`make_console`, made on first use."""
    if name == "console":
        return _console()
    raise AttributeError(f"module 'privsched.cli.common' has no attribute {name!r}")


def new_table(*columns: str, **options: Any) -> Table:
    """A rich table with these column headers (``options``: title, caption, ...)."""
    from rich.table import Table

    return Table(*columns, **options)


def show(renderable: RenderableType) -> None:
    """Print a table (or any rich renderable) on the shared console."""
    _console().print(renderable)


def text(value: object, style: str = "") -> Text:
    """A table cell, title or caption holding ``value`` shown as text (escaped)."""
    from rich.text import Text

    return Text(printable(value), style=style)


def add_row(table: Table, *cells: object) -> None:
    """Add a row whose cells are shown as text (a rich renderable is kept as it is)."""
    from rich.text import Text

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
