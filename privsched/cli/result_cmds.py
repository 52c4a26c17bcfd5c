"""``result`` and ``download``: what a pipeline released, and the files its job left.

Thin layers over :meth:`privsched.client.Client.result` and
:meth:`~privsched.client.Client.download` (or the remote client's, with ``--server``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privsched.cli import skip_teardown
from privsched.cli.common import DEFAULT_DB, DbOption, errors, say
from privsched.cli.output import Format, OutputOption, chosen, emit
from privsched.cli.registry import app


@app.command()
def result(
    pipeline_id: Annotated[int, typer.Argument(help="Pipeline id.")],
    output: OutputOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """What a pipeline released (metrics, primitives' values), its charge as ε at the
    dataset's δ, its state and reason, and its artifacts (JSON and YAML as
    ``GET /v1/pipelines/{id}/result`` answers)."""
    from privsched.cli.remote_option import open_client

    skip_teardown()
    fmt = chosen(output)
    with open_client(db) as client, errors():
        found = client.result(pipeline_id)
    if fmt is not Format.text:
        emit(found.to_dict(), fmt)
        return
    for line in found.lines():
        say(line)


@app.command()
def download(
    pipeline_id: Annotated[int, typer.Argument(help="Pipeline id.")],
    out: Annotated[Path, typer.Option("--out", help="Folder to write the artifacts into (created if missing).")],
    name: Annotated[Optional[list[str]], typer.Option("--name", help="Only this artifact (repeatable).")] = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Copy the files an ended pipeline's job left (a DP-SGD job's model.pt) into a folder,
    and print each file written."""
    from privsched.cli.remote_option import open_client

    skip_teardown()
    with open_client(db) as client, errors():
        written = client.download(pipeline_id, out, name or None)
    for path in written:
        say(path)
