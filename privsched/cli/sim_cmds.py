"""Simulation commands: ``simulate``, ``sweep`` and ``trace``.

Thin layers over :func:`privsched.simulate`, :mod:`privsched.simulation.sweep` and the trace
functions. NumPy, matplotlib and the policies are imported inside command bodies. Inputs
are validated before anything is written, so a bad workload, trace or parameter exits with
one error line and leaves no output behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from privsched.cli import skip_teardown
from privsched.cli.common import add_row, console, errors, fail, one_blas_thread, say, text
from privsched.cli.registry import app

ParamOption = Annotated[
    Optional[list[str]],
    typer.Option("--param", "-p", help="Workload parameter KEY=VALUE (VALUE as JSON when it parses), repeatable."),
]
SeedOption = Annotated[int, typer.Option(help="Seed of the workload generator.")]
DurationOption = Annotated[Optional[float], typer.Option(help="Arrival window in seconds (default: the workload's).")]
#: Most worker processes of a sweep.
MAX_WORKERS = 256


def _params(pairs: list[str] | None) -> dict:
    params: dict = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"workload parameter {pair!r} is not KEY=VALUE")
        if key in params:
            fail(f"workload parameter {key!r} is given twice")
        if key in ("seed", "duration"):
            fail(f"give the workload's {key} with --{key}, not -p")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
        except (RecursionError, ValueError):  # nested too deep, or beyond the integer digit limit
            fail(f"workload parameter {key!r} is not a usable value")
    return params


def _output_folder(out: Path) -> None:
    """Refuse an ``--out`` folder that cannot be created, before any work is done."""
    if out.exists() and not out.is_dir():
        fail(f"--out {out} exists and is not a folder")
    ancestor = out
    while not ancestor.exists():
        if ancestor.is_symlink():
            fail(f"--out {out}: {ancestor} is a dangling symbolic link")
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        fail(f"--out {out} cannot be created: {ancestor} is not a writable folder")


def _output_file(out: Path) -> None:
    """Refuse an ``--out`` file that is a folder or lies where no file can be written."""
    if out.is_dir():
        fail(f"--out {out} is a folder, not a file")
    if out.exists() and not out.is_file():
        fail(f"--out {out} is not a regular file")
    _output_folder(out.parent)


@contextmanager
def _writing(out: Path) -> Iterator[None]:
    """Turn a failure to write the results into one error line."""
    try:
        yield
    except OSError as exc:
        fail(f"cannot write to {out}: {exc.strerror or exc}")


def _duration(value: float | None) -> None:
    from privsched.budgets.bounds import check_number
    from privsched.simulation.limits import MAX_TIME

    if value is not None:
        with errors():
            check_number(value, "--duration", 0.0, MAX_TIME, low_open=True)


def _numbers(text: str | None, kind: type, option: str) -> list:
    if not text:
        return []
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{option} takes comma-separated numbers, got {text!r}")


def _summary_table(summary: dict) -> Table:
    table = Table(title=text(f"{summary['policy']} on {summary['workload']} ({summary['accounting']})"))
    table.add_column("class")
    table.add_column("pipelines", justify="right")
    table.add_column("granted", justify="right")
    for name, counts in summary["by_class"].items():
        add_row(table, name, str(counts["pipelines"]), str(counts["granted"]))
    add_row(table, text("total", "bold"), str(summary["pipelines"]), text(summary["granted"], "bold"))
    delays = "no grant" if summary["delay_p50"] is None else (f"delay p50 {summary['delay_p50']:.2f} s, p99 {summary['delay_p99']:.2f} s")
    table.caption = text(
        f"timed out {summary['timed_out']}, pending {summary['pending']}; {delays}; "
        f"mean block budget used {summary['mean_block_used']:.3f}; "
        f"{summary['passes']} passes in {summary['runtime_s']:.2f} s"
        + ("" if summary.get("mean_fraction") is None else f"; granted on average {summary['mean_fraction']:.3f} of the demand")
    )
    return table


@app.command()
def simulate(
    workload: Annotated[
        str, typer.Argument(help="Workload (single-block, multi-block, macro with optional -rdp, heterogeneous) or trace file.")
    ],
    out: Annotated[Path, typer.Option(help="Directory for result.json, summary.json and (with --plots) figures.")],
    policy: Annotated[str, typer.Option(help="Policy name (fcfs, rr-n, rr-t, dpf-n, dpf-t, dpack, dpack-n, dpack-t, optimal).")] = "dpf-n",
    n: Annotated[Optional[int], typer.Option("--n", help="N: per-arrival unlock divisor.")] = None,
    lifetime: Annotated[Optional[float], typer.Option(help="T: data lifetime in seconds (per-time unlock).")] = None,
    unlock: Annotated[Optional[str], typer.Option(help="Override the unlock rule: all, n or t.")] = None,
    k: Annotated[int, typer.Option(help="DPack: grants between efficiency refreshes.")] = 50,
    tick: Annotated[Optional[float], typer.Option(help="Per-time unlock period in seconds (default T/100).")] = None,
    seed: SeedOption = 0,
    duration: DurationOption = None,
    param: ParamOption = None,
    elastic: Annotated[
        Optional[float],
        typer.Option(
            "--elastic", metavar="MIN_FRACTION", help="Elastic demands: each pipeline accepts [MIN_FRACTION·ε, ε] (workloads that take it)."
        ),
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Also draw the run's figures (PNG).")] = False,
) -> None:
    """Simulate a policy over a workload and write the result, a summary and (with --plots) figures."""
    one_blas_thread()
    from privsched.simulation.api import load_workload, resolve_policy, run

    _output_folder(out)
    _duration(duration)
    params = _params(param)
    if elastic is not None:
        if "elastic" in params:
            fail("workload parameter 'elastic' is given twice")
        params["elastic"] = elastic
    with errors():
        spec = resolve_policy(policy, n=n, lifetime=lifetime, k=k, unlock=unlock)
        label, instance = load_workload(workload, seed=seed, duration=duration, **params)
        result = run(label, instance, spec, tick=tick)
    summary = result.summary()
    with _writing(out):
        out.mkdir(parents=True, exist_ok=True)
        result.save(out / "result.json")
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        if plots:
            from privsched.simulation.plots import result_figures

            result_figures(result, out)
    console.print(_summary_table(summary))
    say(f"wrote {out}/result.json, summary.json" + (" and plots" if plots else ""))
    skip_teardown()


@app.command()
def sweep(
    workloads: Annotated[list[str], typer.Argument(help="Workload names.")],
    out: Annotated[Path, typer.Option(help="Directory for sweep.json, summary.md and figures.")],
    policies: Annotated[str, typer.Option(help="Comma-separated policy names.")] = "fcfs,rr-n,dpf-n,dpf-t,dpack",
    n: Annotated[Optional[str], typer.Option("--n", help="Comma-separated N values.")] = None,
    lifetime: Annotated[Optional[str], typer.Option(help="Comma-separated T values (seconds).")] = None,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    seed: SeedOption = 0,
    param: ParamOption = None,
) -> None:
    """Run a grid of policies and N / T values over workloads, with paper-style figures."""
    one_blas_thread()  # the workers inherit it: the sweep is parallel across processes
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from privsched.simulation.api import resolve_policy
    from privsched.simulation.registry import workload_generators
    from privsched.simulation.sweep import grid, summary_table, write_sweep
    from privsched.simulation.sweep import sweep as run_sweep

    known = workload_generators()
    unknown = [w for w in workloads if w not in known]
    if unknown:
        fail(f"unknown workload {unknown[0]!r} (expected one of: {', '.join(known)})")
    if not 1 <= workers <= MAX_WORKERS:
        fail(f"--workers must be in [1, {MAX_WORKERS}]")
    _output_folder(out)
    params = _params(param)
    ns, lifetimes = _numbers(n, int, "--n"), _numbers(lifetime, float, "--lifetime")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    with errors():
        for name in names:  # validates names and parameters before any run
            resolve_policy(name, n=ns[0] if ns else None, lifetime=lifetimes[0] if lifetimes else None)
        points = grid(workloads, names, ns, lifetimes, seed)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("sweep", total=len(points))

        def done(row: dict) -> None:
            progress.update(task, advance=1, description=f"{row['workload']}: {row['label']} → {row['granted']}")

        with errors():
            rows, best = run_sweep(points, workers=workers, params=params, on_done=done)
    with _writing(out):
        write_sweep(rows, best, out)
    console.print(summary_table(rows))
    say(f"wrote {out}/sweep.json, summary.md and figures")


@app.command()
def trace(
    workload: Annotated[str, typer.Argument(help="Workload (single-block, multi-block, macro with optional -rdp, heterogeneous).")],
    out: Annotated[Path, typer.Option(help="Trace file to write (JSON).")],
    seed: SeedOption = 0,
    duration: DurationOption = None,
    param: ParamOption = None,
) -> None:
    """Save a generated workload as a trace file."""
    one_blas_thread()
    from privsched.simulation.registry import generate_workload, workload_generators
    from privsched.simulation.trace import Trace, save_trace

    _output_file(out)
    _duration(duration)
    params = _params(param)
    if duration is not None:
        params["duration"] = duration
    with errors():
        generated = generate_workload(workload_generators(), workload, seed, params)
        document = generated if isinstance(generated, Trace) else generated.trace
    with _writing(out):
        save_trace(document, out)
    say(f"wrote {len(document.pipelines)} pipelines on {len(document.blocks)} blocks to {out}")
