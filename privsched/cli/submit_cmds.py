"""The ``submit`` command, alone in its module: the command a user waits on most often, and
one that computes nothing until it reads its file. Typer builds the options of every command
registered in the process before it runs one (about 5 ms for the five other scheduler
commands, ``serve``'s twenty options above all, benchmarks/README.md), so ``submit`` does not
share a module with them. A thin layer over :meth:`privsched.client.Client.submit`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from privsched.cli import skip_teardown
from privsched.cli.common import DEFAULT_DB, DbOption, errors, fail, one_blas_thread, readable_result, say
from privsched.cli.registry import app
from privsched.text import printable

if TYPE_CHECKING:
    from privsched.handles import PipelineHandle
    from privsched.ledger import PipelineInfo


def _outcome(info: PipelineInfo) -> str:
    message = f": {info.message}" if info.message else ""
    return f"pipeline {info.id} {info.state}{message}"


@app.command()
def submit(
    pipeline: Annotated[Path, typer.Argument(help="Pipeline specification (YAML, or .json).")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the pipeline to end and print its outcome.")] = False,
    owner: Annotated[Optional[str], typer.Option(help="Owner, when the file gives none (default: you).")] = None,
    submission_id: Annotated[
        Optional[str], typer.Option("--id", help="Submission id (with --server): submitting it again returns the same pipeline.")
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show the demand and whether it fits now (exit 0), waits (3) or can never fit (4); write nothing."),
    ] = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Submit a pipeline and print its id (with --wait: its outcome and what it released; exit
    1 unless it completed)."""
    from privsched.cli.remote_option import open_client, server_url

    # The specification's models are the first pydantic models this process builds, and
    # pydantic looks for plugins then by reading every installed package's metadata (about
    # 30 ms with 150 packages installed, benchmarks/README.md); privsched uses none.
    # PYDANTIC_DISABLE_PLUGINS set (even empty) by the user is kept. This process launches no job.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    one_blas_thread()
    # Everything it writes goes through the client, closed before it returns: the process
    # need not tear down NumPy's and pydantic's objects (about 35 ms, benchmarks/README.md).
    skip_teardown()
    if submission_id is not None and server_url() is None:
        fail("--id (an idempotent submission) needs --server or PRIVSCHED_SERVER")
    with open_client(db) as client, errors():
        if dry_run:
            plan = client.dry_run(pipeline, owner=owner)
            for line in plan.lines():
                say(line)
            if plan.exit_code:
                raise typer.Exit(plan.exit_code)
            return
        if submission_id is None:
            run: PipelineHandle = client.submit(pipeline, owner=owner)
        else:  # an idempotent submission, through a server only (checked above)
            from privsched.remote import RemoteClient

            assert isinstance(client, RemoteClient)
            run = client.submit(pipeline, owner=owner, id=submission_id)
        if not wait:
            say(run.id)
            return
        if client.scheduler() is None:
            print(printable(f"pipeline {run.id} waits for a scheduler: start `privsched serve` on {db}"), file=sys.stderr)
        info = run.wait().info
        released = readable_result(client, run.id)
    say(_outcome(info))
    for line in [] if released is None else released.output_lines():
        say(line)
    if info.state != "completed":
        raise typer.Exit(1)
