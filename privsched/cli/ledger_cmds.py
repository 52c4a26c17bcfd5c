"""Ledger commands: ``init``, ``dataset``, ``blocks``, ``budget show`` and ``audit``.

Each command is a thin layer over one method of the client (:class:`privsched.client.Client`,
or with ``--server`` :class:`privsched.remote.RemoteClient`): ``init`` -> ``init``,
``dataset create`` -> ``create_dataset``, ``dataset schema`` -> ``dataset_schema``,
``blocks import`` -> ``import_blocks``, ``blocks list`` -> ``blocks``, ``budget show`` ->
``balances``, ``audit`` -> ``audit``. The client (numpy, SQLite) is imported inside command
bodies so that ``privsched --help`` stays fast.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar

import typer

from privsched.cli import skip_teardown
from privsched.cli.common import DEFAULT_DB, DbOption, add_row, errors, fail, new_table, one_blas_thread, say, show
from privsched.cli.output import Format, OutputOption, chosen, emit
from privsched.cli.registry import app
from privsched.text import fill_template, printable

if TYPE_CHECKING:
    from privsched.client import Client
    from privsched.ledger import BlockInfo, DatasetInfo
    from privsched.readouts import DatasetBalances, Readout
    from privsched.remote import RemoteClient

dataset_app = typer.Typer(help="Datasets: named streams of blocks sharing a global (ε, δ) guarantee.", no_args_is_help=True)
#: Image formats ``budget show --plot`` writes.
PLOT_FORMATS = (".png", ".svg", ".pdf")
blocks_app = typer.Typer(help="Blocks: the partitions of a dataset that carry budget.", no_args_is_help=True)
budget_app = typer.Typer(help="Privacy budget balances of blocks.", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")
app.add_typer(blocks_app, name="blocks")
app.add_typer(budget_app, name="budget")


def _open(db: Path, *, create: bool = False) -> Client | RemoteClient:
    from privsched.cli.remote_option import open_client

    one_blas_thread()  # budgets, audits and new blocks load NumPy
    return open_client(db, create=create)


T = TypeVar("T")

#: Blocks that ``blocks list`` and ``budget show`` print unless ``--all`` is given.
SHOWN_BLOCKS = 100
AllOption = Annotated[bool, typer.Option("--all", help=f"Every block (default: the {SHOWN_BLOCKS} most recent).")]


def _page(blocks: list[T], states: Sequence[str], every: bool) -> tuple[list[T], str | None]:
    """The blocks to print (the most recent ``SHOWN_BLOCKS`` unless ``every``; ``states``:
    theirs, in the same order), and a line summarising the others, or None when every
    block is printed."""
    if every or len(blocks) <= SHOWN_BLOCKS:
        return blocks, None
    counted = Counter(states)
    counts = ", ".join(f"{count} {state}" for state, count in sorted(counted.items()))
    return blocks[-SHOWN_BLOCKS:], (f"showing the {SHOWN_BLOCKS} most recent of {len(blocks)} blocks ({counts}); --all shows every block")


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).isoformat(sep=" ", timespec="seconds")


@app.command()
def init(db: DbOption = DEFAULT_DB) -> None:
    """Create an empty privsched database (an existing one is left as it is)."""
    skip_teardown()
    with _open(db, create=True) as client, errors():
        where = client.init()
    say(f"privsched database ready at {where}")


@dataset_app.command("create")
def dataset_create(
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    epsilon: Annotated[float, typer.Option("--epsilon", help="Global ε_G of every block.")],
    delta: Annotated[float, typer.Option("--delta", help="Global δ_G of every block.")],
    accounting: Annotated[str, typer.Option(help="basic (ε, δ) composition or rdp.")] = "rdp",
    alphas: Annotated[Optional[str], typer.Option(help="RDP orders, comma-separated (default grid).")] = None,
    conversion: Annotated[
        str,
        typer.Option(
            help="RDP capacity rule: paper, tight, or paper-adaptive / tight-adaptive "
            "(δ_G split over the orders: (ε_G, δ_G) under adaptive demands)."
        ),
    ] = "paper",
    unit: Annotated[
        str, typer.Option("--unit", help="What a block's budget protects: record, user (a person, across the dataset) or user-time.")
    ] = "record",
    user_column: Annotated[Optional[str], typer.Option("--user-column", help="The column naming the person (user units).")] = None,
    max_rows_per_user: Annotated[
        Optional[int], typer.Option("--max-rows-per-user", help="K: rows of one person any read returns (user units; default 1).")
    ] = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Register a dataset with its global guarantee, accounting mode and unit of privacy
    (the database is created if it does not exist yet)."""
    skip_teardown()
    orders = _parse_alphas(alphas)
    with _open(db, create=True) as client, errors():
        info = client.create_dataset(
            name,
            epsilon,
            delta,
            accounting=accounting,
            alphas=orders,
            conversion=conversion,
            unit=unit,
            user_column=user_column,
            max_rows_per_user=max_rows_per_user,
        )
    say(f"dataset {info.name}: {info.accounting.name}, ε_G={info.epsilon:g}, δ_G={info.delta:g}, unit {info.unit_text()}")


def _parse_alphas(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        fail(f"--alphas must be comma-separated numbers, got {text!r}")


@dataset_app.command("list")
def dataset_list(output: OutputOption = None, db: DbOption = DEFAULT_DB) -> None:
    """List datasets with their accounting mode and global budget."""
    skip_teardown()
    fmt = chosen(output)
    with _open(db) as client, errors():
        datasets = client.datasets()
    if fmt is not Format.text:
        from privsched.server.models import DatasetOut

        emit([DatasetOut.of(info, []).model_dump() for info in datasets], fmt)
        return
    table = new_table("name", "accounting", "ε_G", "δ_G", "unit", "conversion", "orders", "created")
    for info in datasets:
        orders = ",".join(f"{a:g}" for a in info.accounting.alphas) or "-"
        conversion = info.conversion if info.accounting.is_rdp else "-"
        add_row(
            table,
            info.name,
            info.accounting.name,
            f"{info.epsilon:g}",
            f"{info.delta:g}",
            info.unit_text(),
            conversion,
            orders,
            _when(info.created_at),
        )
    show(table)


@dataset_app.command("schema")
def dataset_schema(name: Annotated[str, typer.Argument(help="Dataset name.")], db: DbOption = DEFAULT_DB) -> None:
    """A dataset's columns and types, with the public bounds and categories declared at its
    first import (public by declaration)."""
    skip_teardown()
    with _open(db) as client, errors():
        schema = client.dataset_schema(name)
    if schema is None:
        say(f"dataset {name} has no schema yet: its first `blocks import` records one")
        return
    table = new_table("column", "type", "declared")
    for column, kind in schema.columns.items():
        declared = "-"
        if column in schema.bounds:
            low, high = schema.bounds[column]
            declared = f"bounds {low:g}:{high:g}"
        elif column in schema.categories:
            declared = "categories " + ",".join(schema.categories[column])
        add_row(table, column, kind, declared)
    show(table)


@blocks_app.command("add")
def blocks_add(
    dataset: Annotated[str, typer.Argument(help="Dataset the blocks belong to.")],
    keys: Annotated[list[str], typer.Argument(help="Block keys, e.g. dates or user ranges.")],
    location: Annotated[Optional[list[str]], typer.Option(help="KEY=PATH data location (repeatable).")] = None,
    location_template: Annotated[
        Optional[str],
        typer.Option(
            help="Data location of every block, with {key} (and {dataset}) replaced, e.g. 'data/{key}.npz'; {{ and }} stand for braces."
        ),
    ] = None,
    unlocked: Annotated[float, typer.Option(help="Fraction of each block's capacity unlocked at once.")] = 0.0,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Add blocks to a dataset, each with the dataset's capacity."""
    skip_teardown()
    locations = _parse_locations(location or [], keys, location_template, dataset)
    with _open(db) as client, errors():
        added = client.add_blocks(dataset, [(k, locations.get(k)) for k in keys], unlocked=unlocked)
    say(f"added {len(added)} block(s) to {dataset}")


def _parse_locations(pairs: Sequence[str], keys: Sequence[str], template: str | None, dataset: str) -> dict[str, str]:
    locations = {}
    if template is not None:
        with errors():
            locations = {key: fill_template(template, key=key, dataset=dataset) for key in keys}
    for pair in pairs:
        key, sep, path = pair.partition("=")
        if not sep or not key or not path:
            fail(f"--location must be KEY=PATH, got {pair!r}")
        if key not in keys:
            fail(f"--location names block {key!r}, which is not among the blocks added")
        locations[key] = path
    return locations


@blocks_app.command("import")
def blocks_import(
    dataset: Annotated[str, typer.Argument(help="Dataset the blocks belong to.")],
    files: Annotated[list[str], typer.Argument(help="CSV, Parquet or JSON Lines files (.csv, .parquet, .jsonl), imported together.")],
    by: Annotated[Optional[str], typer.Option("--by", help="Column whose value (or period) keys each row's block.")] = None,
    every: Annotated[Optional[str], typer.Option("--every", help="Group a date or time column by day, week or month.")] = None,
    partitions: Annotated[
        Optional[int], typer.Option("--partitions", help="User partitions P of a user or user-time dataset (fixed at its first import).")
    ] = None,
    store: Annotated[Optional[Path], typer.Option("--store", help="Block store folder (default: <db>.blocks beside the database).")] = None,
    bounds: Annotated[
        Optional[list[str]], typer.Option("--bounds", help="Declare a column's public bounds, COLUMN=LOW:HIGH (repeatable).")
    ] = None,
    categories: Annotated[
        Optional[list[str]], typer.Option("--categories", help="Declare a column's public values, COLUMN=A,B,C (repeatable).")
    ] = None,
    unlocked: Annotated[float, typer.Option(help="Fraction of each new block's capacity unlocked at once.")] = 0.0,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Import tables as sealed blocks: one Parquet block per value of --by (or per --every
    period), written once into the block store with its SHA-256, all in one transaction.
    A user-unit dataset's rows go to P user blocks by a keyed hash of the person (by period
    too for user-time), each person's always to the same block."""
    from privsched.data.tables import parse_declarations

    skip_teardown()
    with errors():
        declared_bounds, declared_categories = parse_declarations(bounds or [], categories or [])
    with _open(db) as client, errors():
        report = client.import_blocks(
            dataset,
            files,
            by=by,
            every=every,
            partitions=partitions,
            store=None if store is None else str(store),
            bounds=declared_bounds,
            categories=declared_categories,
            unlocked=unlocked,
        )
    kept = f", {len(report.kept)} already there" if report.kept else ""
    kept += f", {len(report.grown)} user block(s) grown" if report.grown else ""
    say(f"imported {report.rows} rows into {len(report.added)} new block(s) of {report.dataset}{kept}")


@blocks_app.command("list")
def blocks_list(
    dataset: Annotated[Optional[str], typer.Argument(help="Only this dataset's blocks.")] = None,
    every: AllOption = False,
    output: OutputOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """List blocks with their state and data location (the most recent ones, or --all)."""
    skip_teardown()
    fmt = chosen(output)
    with _open(db) as client, errors():
        listed = client.blocks(dataset)
    blocks, note = _page(listed, [block.state for block in listed], every)
    if fmt is not Format.text:
        from privsched.server.models import BlockOut

        emit([BlockOut.of(block, admin=block.sha256 is not None).model_dump() for block in blocks], fmt)
        return
    table = new_table("id", "dataset", "key", "state", "location", "created", caption=note)
    for block in blocks:
        add_row(table, str(block.id), block.dataset, block.key, block.state, block.location or "-", _when(block.created_at))
    show(table)


@budget_app.command("show")
def budget_show(
    dataset: Annotated[Optional[str], typer.Argument(help="Only this dataset.")] = None,
    every: AllOption = False,
    detail: Annotated[bool, typer.Option("--detail", help="Also each block's budget per RDP order (or in ε and δ).")] = False,
    plot: Annotated[
        Optional[Path],
        typer.Option("--plot", help="Also draw every block's budget as a stacked bar to this image (.png, .svg or .pdf).", dir_okay=False),
    ] = None,
    output: OutputOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Per block: the share of its capacity consumed, allocated and left (consumed +
    allocated + left = 100 %), and the ε left and consumed at the dataset's δ_G (the most
    recent blocks of each dataset, or --all); --detail adds the budget per RDP order.

    Under RDP a share is read at the order with the most left (where a demand still fits),
    and each curve as the ε it guarantees at δ_G (Opacus' tight conversion, over the live
    orders where the curve is positive)."""
    skip_teardown()
    fmt = chosen(output)
    if plot is not None and plot.suffix.lower() not in PLOT_FORMATS:
        fail(f"--plot {plot.name}: the file name must end in one of {', '.join(PLOT_FORMATS)}")
    with _open(db) as client, errors():
        balances = client.balances(dataset)
    if plot is not None:
        from privsched.dashboard.figure import plot_budgets

        try:
            plot_budgets([(entry.dataset, [row.block for row in entry.blocks]) for entry in balances], plot)
        except OSError as error:
            fail(f"--plot {plot}: {error.strerror or error}")
    if fmt is not Format.text:
        emit([_balances_document(entry, every, detail) for entry in balances], fmt)
        return
    for entry in balances:
        _show_balances(entry, every, detail)
    if plot is not None:
        say(f"budget figure: {plot}")


def _show_balances(entry: DatasetBalances, every: bool, detail: bool) -> None:
    """One dataset's table of ``budget show`` (and with ``detail`` one table per block)."""
    from privsched.readouts import block_shares, tenths

    info = entry.dataset
    rdp = info.accounting.is_rdp
    title = f"{info.name}: {info.accounting.name}, ε_G={info.epsilon:g}, δ_G={info.delta:g} per {info.unit_text()}"
    shown, note = _page(entry.blocks, [row.block.state for row in entry.blocks], every)
    unit = f"ε at δ_G={info.delta:g}" if rdp else "ε, δ"
    caption = "shares of each block's capacity" + (" at its order with the most left" if rdp else "") + (f"; {note}" if note else "")
    table = new_table(
        "block",
        "state",
        "consumed",
        "allocated",
        "left",
        "unlocked now",
        f"left ({unit})",
        f"consumed ({unit})",
        title=title,
        caption=caption,
    )
    for row in shown:
        shares = block_shares(row.block, info)
        consumed, allocated, left = tenths((shares.consumed, shares.allocated, shares.left))
        unlocked = min(max(round(shares.unlocked * 1000), 0), left)  # a part of what is left
        add_row(
            table,
            row.block.key,
            row.block.state,
            *(_percent(t) for t in (consumed, allocated, left, unlocked)),
            budget_text(row.remaining, rdp),
            budget_text(row.consumed, rdp),
        )
    show(table)
    if detail:
        _show_detail(info, [row.block for row in shown])


def _show_detail(info: DatasetInfo, blocks: list[BlockInfo]) -> None:
    """``budget show --detail``: each block's budget per live RDP order (or in ε and δ)."""
    import numpy as np

    rdp = info.accounting.is_rdp
    labels = info.accounting.dimension_labels()
    for block in blocks:
        labels = info.accounting.dimension_labels()
        title = f"{info.name} {block.key}" + (" (RDP ε(α) per live order)" if rdp else "")
        parts = new_table("order" if rdp else "", "capacity", "locked", "unlocked", "allocated", "consumed", title=title)
        vectors = (block.capacity, block.locked, block.unlocked, block.allocated, block.consumed)
        for i in np.flatnonzero(info.accounting.live(block.capacity)):
            add_row(parts, labels[i], *(f"{float(v[i]):.4g}" for v in vectors))
        show(parts)


def _percent(tenths: int) -> str:
    return f"{tenths / 10:.1f} %"


def _balances_document(entry: DatasetBalances, every: bool, detail: bool) -> dict[str, Any]:
    """``budget show -o json``: the dataset's budget as ``GET /v1/budget`` answers it, for the
    blocks the table would show."""
    from privsched.readouts import DatasetBalances
    from privsched.server.models import BudgetOut

    shown, _ = _page(entry.blocks, [row.block.state for row in entry.blocks], every)
    return BudgetOut.of(DatasetBalances(entry.dataset, shown), detail=detail).model_dump()


def budget_text(amount: Readout, rdp: bool) -> str:
    """A budget as text: "ε, δ" under basic accounting; under RDP the ε the curve implies
    at the dataset's δ_G (:mod:`privsched.readouts`)."""
    if not rdp:
        return f"{amount.epsilon:.4g}, {amount.delta:.3g}"
    return "0" if amount.epsilon == 0 else f"{amount.epsilon:.4g}"


@app.command()
def audit(
    db: DbOption = DEFAULT_DB,
    export: Annotated[
        bool, typer.Option("--export", help="Print only the event log's chain head (<event id>:<sha256>) to keep elsewhere.")
    ] = False,
    expect: Annotated[
        Optional[str],
        typer.Option(
            "--expect", metavar="HEAD", help="A chain head kept earlier: fail unless the log still holds it (history not rewritten)."
        ),
    ] = None,
) -> None:
    """Verify the event log's hash chain, rebuild every capacity, demand, state and balance from
    it and check every invariant (exit 1 naming each violation)."""
    skip_teardown()
    with _open(db) as client, errors():
        report = client.audit(expect=expect)
    if not report.ok:
        for violation in report.violations:
            print(f"violation: {printable(violation)}", file=sys.stderr)
        raise typer.Exit(1)
    if export:
        say(report.head)
        return
    say(f"audit ok: {report.blocks} blocks, {report.events} events, every invariant holds; chain head {report.head}")
