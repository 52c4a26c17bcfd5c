"""Scheduler commands: ``list``, ``status``, ``cancel``, ``logs`` and ``serve`` (``submit`` has
its own module, :mod:`privsched.cli.submit_cmds`).

Each is a thin layer over the :class:`privsched.client.Client` method of the same name.
Imports of the client (numpy, the ledger, pydantic models) happen inside command bodies so
that ``privsched --help`` stays fast.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from privsched.cli import skip_teardown
from privsched.cli.common import DEFAULT_DB, DbOption, add_row, errors, fail, new_table, one_blas_thread, readable_result, say, show
from privsched.cli.output import Format, OutputOption, chosen, emit
from privsched.cli.registry import app
from privsched.text import printable

if TYPE_CHECKING:
    from privsched.client import Client
    from privsched.ledger import Event, PipelineInfo
    from privsched.service.serve import Startup
    from privsched.service.waiting import WaitingReason
    from privsched.remote import RemoteClient


def _client(db: Path) -> Client | RemoteClient:
    from privsched.cli.remote_option import open_client

    return open_client(db)


#: The timing row of ``status`` that each state change of a pipeline sets.
_TIMING_ROWS = {
    "submit": "submitted",
    "grant": "granted",
    "run": "started",
    "complete": "finished",
    "fail": "finished",
    "cancel": "finished",
    "expire": "finished",
    "reuse": "finished",
}


#: The rows of ``status`` that each event of these kinds adds: a request to cancel the
#: running job, a release of the pipeline's budget.
_EVENT_ROWS = {"stop": "cancel requested", "release": "released"}


def _caused_by(events: list[Event]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """From a pipeline's events: " by <actor>" for each timing row of ``status``, and a
    ("cancel requested" or "released", "<time> by <actor>") row per request to cancel the running
    job and per release of its budget (events recorded before actors were name nobody)."""
    by: dict[str, str] = {}
    rows: list[tuple[str, str]] = []
    for event in events:
        if event.amount is not None or event.actor is None:
            continue
        if event.kind in _EVENT_ROWS:
            rows.append((_EVENT_ROWS[event.kind], f"{_when(event.at)} by {event.actor}"))
        elif event.kind in _TIMING_ROWS:
            by[_TIMING_ROWS[event.kind]] = f" by {event.actor}"
    return by, rows


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.fromtimestamp(timestamp).isoformat(sep=" ", timespec="seconds")


#: Seconds between two redraws of ``list --watch``.
WATCH_PERIOD = 2.0


@app.command("list")
def list_pipelines(
    state: Annotated[Optional[list[str]], typer.Option(help="Only pipelines in this state (repeatable).")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="Only this dataset's pipelines.")] = None,
    owner: Annotated[Optional[str], typer.Option(help="Only this user's pipelines.")] = None,
    mine: Annotated[bool, typer.Option("--mine", help="Only your own pipelines (through --server: the token's user).")] = False,
    limit: Annotated[Optional[int], typer.Option(min=1, help="Only the N most recent pipelines.")] = None,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help=f"Redraw every {WATCH_PERIOD:g} s until interrupted (a terminal only).")
    ] = False,
    output: OutputOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """List pipelines with their state, owner and why each waiting one waits."""
    skip_teardown()
    fmt = chosen(output)
    if mine and owner is not None:
        fail("--mine and --owner both name whose pipelines to list: give one")
    if watch and not sys.stdout.isatty():
        print("error: --watch redraws a terminal; without one, run `privsched list` again instead", file=sys.stderr)
        raise typer.Exit(2)
    one_blas_thread()  # ranking the pending pipelines loads NumPy
    with _client(db) as client:
        try:
            while True:
                with errors():
                    pipelines = client.list(states=state, dataset=dataset, owner=owner, mine=mine, limit=limit)
                    waiting = any(p.state in ("pending", "granted") for p in pipelines)
                    reasons = client.reasons(dataset) if waiting and fmt is Format.text else {}
                if watch:
                    sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: redraw in place
                _print_pipelines(pipelines, reasons, fmt)
                if not watch:
                    return
                time.sleep(WATCH_PERIOD)
        except KeyboardInterrupt:  # Ctrl-C ends a watch, as it ends `kubectl get -w`
            if not watch:
                raise


def _print_pipelines(pipelines: list[PipelineInfo], reasons: dict[int, WaitingReason], fmt: Format) -> None:
    """``list``'s answer: a table, or the pipelines as ``GET /v1/pipelines`` answers them."""
    if fmt is not Format.text:
        from privsched.server.models import PipelineOut

        emit([PipelineOut.of(info, message=info.message).model_dump() for info in pipelines], fmt)
        return
    table = new_table("id", "name", "dataset", "state", "owner", "blocks", "submitted", "finished", "reason")
    for info in pipelines:
        reason = reasons[info.id].short() if info.id in reasons else "-"
        add_row(
            table,
            str(info.id),
            info.name,
            info.dataset,
            info.state,
            info.owner,
            str(len(info.block_keys)),
            _when(info.submitted_at),
            _when(info.finished_at),
            reason,
        )
    show(table)


@app.command()
def status(
    pipeline_id: Annotated[int, typer.Argument(help="Pipeline id.")],
    output: OutputOption = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """A pipeline's state, its demand on each block (ε at the dataset's δ_G and the share of
    the block's capacity it takes), what it consumed, placement and timings, and what keeps
    the scheduler from making progress, if anything does (a full database or disk)."""
    skip_teardown()
    from privsched.cli.ledger_cmds import budget_text
    from privsched.readouts import demand_share, demand_text

    fmt = chosen(output)
    one_blas_thread()  # its budgets and waiting reason load NumPy
    if fmt is not Format.text:
        from privsched.server.models import PipelineOut

        from privsched.server.models import BlockDemandOut

        with _client(db) as client, errors():
            found, dataset, _ = client.grants(pipeline_id)
        out = PipelineOut.of(found, message=found.message)
        out.budget = BlockDemandOut.of_pipeline(found, dataset)
        emit(out.model_dump(), fmt)
        return
    with _client(db) as client, errors():
        info, dataset, grants = client.grants(pipeline_id)
        reason = client.reasons(info.dataset, pipeline_id=pipeline_id).get(pipeline_id) if info.state in ("pending", "granted") else None
        condition = client.scheduler_condition()
        by, caused = _caused_by(client.events(pipeline_id=pipeline_id))
        released = readable_result(client, pipeline_id) if info.state.is_final() else None
    acc, delta = dataset.accounting, dataset.delta
    unit = f"ε at δ={delta:g}" if acc.is_rdp else "ε, δ"
    table = new_table("field", "value", title=f"pipeline {info.id}: {info.name}", show_header=False)
    add_row(table, "state", info.state + (f" ({info.message})" if info.message else ""))
    add_row(table, "dataset", f"{info.dataset} ({acc.name})")
    add_row(table, "owner", info.owner)
    if condition is not None:
        add_row(table, "scheduler", f"{condition}; retrying")
    if reason is not None:
        add_row(table, "waiting", reason.text())
    for grant in grants:
        consumed = "" if grant.consumed is None else f"; consumed {budget_text(grant.consumed, acc.is_rdp)} ({unit})"
        demand = demand_text(grant.demand.epsilon, demand_share(info.demands[grant.key], dataset), grant.key)
        add_row(table, f"block {grant.key}", f"demand {demand}{consumed}")
    for label, value in elastic_rows(info):
        add_row(table, label, value)
    if (source := info.job.get("reused_from")) is not None:
        add_row(table, "reused_from", f"{source} (its release, returned at no charge)")
    if (answer := info.job.get("answered_from_cache")) is not None:
        add_row(table, "answered_from_cache", f"pipelines {', '.join(map(str, answer['sources']))} (their releases, at no charge)")
    if (update := info.job.get("cache_update")) is not None:
        add_row(table, "cache_update", f"its release combined with those of pipelines {', '.join(map(str, update['sources']))}")
    if info.placement:
        add_row(table, "placement", ", ".join(f"{k}={v}" for k, v in info.placement.items()))
    for label, at in (
        ("submitted", info.submitted_at),
        ("granted", info.granted_at),
        ("started", info.started_at),
        ("finished", info.finished_at),
    ):
        add_row(table, label, _when(at) + by.get(label, ""))
    for label, value in caused:
        add_row(table, label, value)
    if info.started_at is not None:
        add_row(table, "run time", f"{(info.finished_at or time.time()) - info.started_at:.1f} s")
    show(table)
    for line in [] if released is None else released.output_lines():  # its state and charge are in the table
        say(line)


def elastic_rows(info: PipelineInfo) -> list[tuple[str, str]]:
    """An elastic pipeline's range of ε, the least fraction of its demand it accepts, and the
    fraction it was granted (docs/design.md §10); nothing for a fixed demand."""
    least = info.job.get("epsilon_min")
    if least is None:
        return []
    rows = [("epsilon", f"range [{least:g}, {info.job.get('epsilon'):g}], accepts {info.elastic_min or 1.0:.4g} of its demand or more")]
    if info.granted_at is not None:
        rows.append(("granted share", f"{info.fraction or 1.0:.4g} of its demand"))
    return rows


@app.command()
def cancel(
    pipeline_id: Annotated[int, typer.Argument(help="Pipeline id.")],
    db: DbOption = DEFAULT_DB,
) -> None:
    """Cancel a pipeline (a running job is stopped, and its pipeline fails).

    A pending or granted pipeline is cancelled at once (a grant is released); a running job
    is stopped by the scheduler and its allocation consumed, since it may have read data."""
    skip_teardown()
    with _client(db) as client, errors():
        outcome = client.cancel(pipeline_id)
    say(f"pipeline {pipeline_id} {outcome}")


@app.command()
def logs(
    pipeline_id: Annotated[int, typer.Argument(help="Pipeline id.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the pipeline ends.")] = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Print a job's output (stdout and stderr)."""
    skip_teardown()
    with _client(db) as client, errors():
        offset = 0
        while True:
            chunk, ended = client.log_chunk(pipeline_id, offset)
            offset += len(chunk)
            sys.stdout.write(printable(chunk.decode(errors="replace"), keep="\n\t"))
            sys.stdout.flush()
            if not follow or (ended and not chunk):
                return
            if not chunk:
                time.sleep(0.2)


#: ``serve``'s N when a per-arrival policy is given none: each pipeline unlocks 1/100 of
#: every block (DPF's N, Luo et al., OSDI'21 §4.1).
DEFAULT_N = 100
#: The policies that unlock per arrival, and so take N.
PER_ARRIVAL = ("rr-n", "dpf-n", "dpack-n")


@app.command()
def serve(
    policy: Annotated[str, typer.Option(help="fcfs, rr-n, rr-t, dpf-n, dpf-t, dpack, dpack-n, dpack-t, optimal.")] = "dpf-n",
    n: Annotated[
        Optional[int], typer.Option("--n", help=f"Per-arrival unlocking: each pipeline unlocks 1/N (default {DEFAULT_N}).")
    ] = None,
    lifetime: Annotated[Optional[str], typer.Option(help="Per-time unlocking: data lifetime, e.g. 600 or 2h.")] = None,
    unlock: Annotated[Optional[str], typer.Option(help="Override the unlock rule: all, n or t.")] = None,
    k: Annotated[int, typer.Option(help="DPack: grants between efficiency refreshes.")] = 50,
    tick: Annotated[str, typer.Option(help="Scheduling period, e.g. 1s or 500ms.")] = "1s",
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Exit once nothing more can run.")] = False,
    gpus: Annotated[Optional[int], typer.Option(help="Declare N GPUs (default: detected).")] = None,
    cpus: Annotated[Optional[float], typer.Option(help="CPUs jobs may use (default: this machine's).")] = None,
    memory: Annotated[Optional[str], typer.Option(help="Memory jobs may use, e.g. 64G (default: this machine's).")] = None,
    executor: Annotated[str, typer.Option(help="Where jobs run: local, or ray (a Ray cluster).")] = "local",
    ray_address: Annotated[
        Optional[str], typer.Option(help="Ray dashboard address, e.g. http://head:8265 (default: $RAY_ADDRESS, else this machine).")
    ] = None,
    sandbox: Annotated[
        Optional[str],
        typer.Option(help="Job confinement: landlock, or none to run jobs unconfined (default: $PRIVSCHED_SANDBOX, else landlock)."),
    ] = None,
    allow_network: Annotated[
        bool, typer.Option("--allow-network", help="Let jobs that ask for it (job.network) open TCP connections.")
    ] = False,
    train_across_nodes: Annotated[
        bool,
        typer.Option("--train-across-nodes", help="Ray executor: data-parallel DP-SGD trains across nodes with Ray Train."),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final summary.")] = False,
    listen: Annotated[
        Optional[str],
        typer.Option(help="Serve the HTTP API on HOST:PORT; 'none' for no API (default: 127.0.0.1:8470, none with --until-idle)."),
    ] = None,
    tls_cert: Annotated[Optional[str], typer.Option(help="TLS certificate (PEM) of the HTTP API.")] = None,
    tls_key: Annotated[Optional[str], typer.Option(help="TLS private key (PEM) of the HTTP API.")] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow plain HTTP on a non-loopback address (tokens travel in clear).")
    ] = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Run the scheduler on the database (one per database) until interrupted: by default
    DPF with per-arrival unlocking (dpf-n, N = 100). Once it holds the database it starts
    the HTTP API and prints what it serves with: policy, compute pool, executor, sandbox,
    database and API address."""
    from privsched.cli.remote_option import local_client, local_only
    from privsched.server.runner import api_for_options
    from privsched.service.serve import ServeOptions

    local_only("serve")
    with errors():
        per_arrival = policy in PER_ARRIVAL or unlock == "n"
        options = ServeOptions.parse(
            policy=policy,
            n=DEFAULT_N if n is None and lifetime is None and per_arrival else n,
            lifetime=lifetime,
            k=k,
            unlock=unlock,
            tick=tick,
            until_idle=until_idle,
            gpus=gpus,
            cpus=cpus,
            memory=memory,
            executor=executor,
            ray_address=ray_address,
            sandbox=sandbox,
            allow_network=allow_network,
            train_across_nodes=train_across_nodes,
        )
        options.check()  # before the API or any job starts
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def log(message: str) -> None:
        if not quiet:
            say(f"{datetime.now().isoformat(sep=' ', timespec='seconds')} {message}")

    def started(startup: Startup) -> None:  # the database is this scheduler's: start the API, say so
        bound = api.enter_context(api_for_options(db, listen, until_idle, tls_cert, tls_key, insecure, None, startup.policy))
        for line in startup.lines(None if bound is None else f"{bound.url} (OpenAPI page: {bound.url}/docs)"):
            if not quiet:
                say(line)

    with local_client(db) as client, errors(), ExitStack() as api:
        summary = client.serve(options, stop=stop, log=log, on_start=started)
    say(f"served {summary.ticks} ticks: {summary.granted} granted, {summary.settled} finished, {summary.pending} still pending")
