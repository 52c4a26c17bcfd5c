"""The global options, accepted before the command word: ``--server`` (with it, or
``PRIVSCHED_SERVER``, commands go through a privsched server's HTTP API with the bearer token
in ``PRIVSCHED_TOKEN``, never on the command line, where other users of the machine could
read it in the process list), ``--db`` (the database every command then uses unless it is
given its own ``--db``), ``-o``/``--output`` (:mod:`privsched.cli.output`, unless the command
is given its own) and ``--version``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from privsched.cli.registry import app
from privsched.cli.common import DB_ENV, errors
from privsched.cli.output import OutputOption, set_global

if TYPE_CHECKING:
    from privsched.client import Client
    from privsched.remote import RemoteClient

SERVER_ENV = "PRIVSCHED_SERVER"
TOKEN_ENV = "PRIVSCHED_TOKEN"

_server: dict[str, str | None] = {"url": None}


def _print_version(wanted: bool) -> None:
    if wanted:
        from privsched import __version__

        print(f"privsched {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    server: Annotated[
        Optional[str],
        typer.Option(
            "--server", envvar=SERVER_ENV, help="A privsched server's address, e.g. https://host:8470 (token from PRIVSCHED_TOKEN)."
        ),
    ] = None,
    db: Annotated[
        Optional[Path], typer.Option("--db", help="privsched database file for the command that follows (or set PRIVSCHED_DB).")
    ] = None,
    output: OutputOption = None,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_print_version, help="Print privsched's version and exit.")
    ] = False,
) -> None:
    """Privacy-budget-aware job scheduler for differentially private machine learning."""
    _server["url"] = server or None
    set_global(output)
    if db is not None:
        # The command's own --db option is parsed after this callback and reads the variable
        # as its default: a --db given before the command word applies to it (this command only).
        before = os.environ.get(DB_ENV)
        os.environ[DB_ENV] = str(db)
        ctx.call_on_close(lambda: os.environ.pop(DB_ENV) if before is None else os.environ.update({DB_ENV: before}))


def server_url() -> str | None:
    """The server commands go through, or None for the local database."""
    return _server["url"]


def remote_client() -> RemoteClient:
    from privsched.remote import RemoteClient

    with errors():
        return RemoteClient(server_url() or "", os.environ.get(TOKEN_ENV))


def open_client(db: Path, *, create: bool = False) -> Client | RemoteClient:
    """The server's client with ``--server``, else a client of the database ``db`` (created
    on first use only with ``create``)."""
    if server_url() is not None:
        return remote_client()
    return local_client(db, create=create)


def local_client(db: Path, *, create: bool = False) -> Client:
    """A client of the database ``db`` (created on first use only with ``create``)."""
    from privsched.client import open_client

    with errors():
        return open_client(db, create=create)


def local_only(command: str) -> None:
    """Refuse a command that must run beside the database, not through a server."""
    if server_url() is not None:
        from privsched.cli.common import fail

        fail(f"`privsched {command}` runs on the scheduler's machine, not through --server")
