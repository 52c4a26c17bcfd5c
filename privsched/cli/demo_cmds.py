"""``privsched demo``: the end-to-end demonstration (see :mod:`privsched.demo`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from privsched.cli.common import errors, make_console
from privsched.cli.registry import app


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Folder for the database, block files, job runs and figure.")] = Path("runs/demo"),
    days: Annotated[int, typer.Option(min=2, help="Daily blocks of synthetic reviews.")] = 12,
    reviews_per_day: Annotated[int, typer.Option(min=100, help="Reviews in each daily block.")] = 1000,
    n: Annotated[int, typer.Option(min=1, help="DPF-N: arrivals that unlock a block fully.")] = 12,
    limit: Annotated[Optional[int], typer.Option(min=1, help="Submit only the first LIMIT pipelines.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
) -> None:
    """Schedule DP statistics and DP-SGD models on synthetic reviews with DPF, end to end."""
    from privsched.demo import DemoConfig, run_demo

    # Wide enough for the pipeline table when the output is a file or a pipe, not a terminal.
    console = make_console() if sys.stdout.isatty() else make_console(width=160)
    config = DemoConfig(out=out, days=days, reviews_per_day=reviews_per_day, n=n, limit=limit, seed=seed)
    with errors():
        run_demo(config, console)
