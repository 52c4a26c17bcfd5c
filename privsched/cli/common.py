"""Helpers every ``privsched`` command module shares: the ``--db`` option, one-line errors,
and the console and table rows that print user text as text.

Listings are plain-text tables (:func:`new_table`, :mod:`privsched.cli.tables`); the
simulator's reports and progress bars use Rich, with markup off on its console. Every
cell, title and caption is escaped (:func:`privsched.text.printable`): a name such as
``[/]`` or one holding an escape sequence is shown, never interpreted. Rich is imported
only when a command prints a rich renderable or uses :data:`console`, so that a listing
does not pay for it.
"""

from __future__ import annotations

import os
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

    from privsched.cli.tables import Table as PlainTable
    from privsched.client import Client
    from privsched.remote import RemoteClient
    from privsched.results import PipelineResult

#: Environment variable naming the database when ``--db`` is not given.
DB_ENV = "PRIVSCHED_DB"
#: Database used when neither ``--db`` nor ``PRIVSCHED_DB`` is given.
DEFAULT_DB = Path("privsched.db")

DbOption = Annotated[
    Path,
    typer.Option("--db", envvar=DB_ENV, help="privsched database file (or set PRIVSCHED_DB).", show_default=True),
]


def one_blas_thread() -> None:
    """Before NumPy loads: one OpenBLAS thread. Loading NumPy starts a BLAS thread per core
    otherwise, a third of NumPy's import time here (``python -c "import numpy"``: 0.16–0.18 s
    wall against 0.09–0.12 s on 2 cores, benchmarks/README.md) for commands whose arrays
    hold a few dozen numbers and multiply no matrices, and for the simulator, whose passes
    are element-wise (its idle BLAS threads spin: 0.1–0.2 s of CPU a run, no wall time
    gained). A value set by the user is kept; commands that call it launch no job, which
    would inherit it."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


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


def new_table(*columns: str, title: object = None, caption: object = None, show_header: bool = True) -> PlainTable:
    """A plain-text table with these column headers (:mod:`privsched.cli.tables`)."""
    from privsched.cli.tables import Table as PlainTable

    return PlainTable(*columns, title=title, caption=caption, show_header=show_header)


def show(table: PlainTable | RenderableType) -> None:
    """Print a table of :func:`new_table` on stdout, or a rich renderable on the shared console."""
    from privsched.cli.tables import Table as PlainTable

    if isinstance(table, PlainTable):
        print(table.render(), flush=True)
    else:
        _console().print(table)


def text(value: object, style: str = "") -> Text:
    """A rich table's cell, title or caption holding ``value`` shown as text (escaped)."""
    from rich.text import Text

    return Text(printable(value), style=style)


def add_row(table: PlainTable | Table, *cells: object) -> None:
    """Add a row whose cells are shown as text (in a rich table, a rich renderable is kept as it is)."""
    from privsched.cli.tables import Table as PlainTable

    if isinstance(table, PlainTable):
        table.add_row(*cells)
        return
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


def readable_result(client: Client | RemoteClient, pipeline_id: int) -> PipelineResult | None:
    """The pipeline's result (:meth:`privsched.client.Client.result`), or None when the
    caller may not read it (a server's 403: another user's code job)."""
    from privsched.errors import PrivschedError

    try:
        return client.result(pipeline_id)
    except PrivschedError as exc:
        if exc.status == 403:
            return None
        raise
