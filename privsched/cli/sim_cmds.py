"""Simulation commands: ``simulate``, ``sweep`` and ``trace``.

Thin layers over :func:`privsched.simulate`, :mod:`privsched.simulation.sweep` and the trace
functions. NumPy, matplotlib and the policies are imported inside command bodies. Inputs
are validated before anything is written, so a bad workload, trace or parameter exits with
one error line and leaves no output behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from privsched.cli.registry import app
from privsched.cli.common import console, errors, fail

ParamOption = Annotated[
    Optional[list[str]],
    typer.Option("--param", "-p", help="Workload parameter KEY=VALUE (VALUE as JSON when it parses), repeatable."),
]
SeedOption = Annotated[int, typer.Option(help="Seed of the workload generator.")]
DurationOption = Annotated[Optional[float], typer.Option(help="Arrival window in seconds (default: the workload's).")]


def _params(pairs: list[str] | None) -> dict:
    params = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"workload parameter {pair!r} is not KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def _numbers(text: str | None, kind: type, option: str) -> list:
    if not text:
        return []
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{option} takes comma-separated numbers, got {text!r}")


def _summary_table(summary: dict) -> Table:
    table = Table(title=f"{summary['policy']} on {summary['workload']} ({summary['accounting']})")
    table.add_column("class")
    table.add_column("pipelines", justify="right")
    table.add_column("granted", justify="right")
    for name, counts in summary["by_class"].items():
        table.add_row(name, str(counts["pipelines"]), str(counts["granted"]))
    table.add_row("[bold]total", str(summary["pipelines"]), f"[bold]{summary['granted']}")
    delays = "no grant" if summary["delay_p50"] is None else (
        f"delay p50 {summary['delay_p50']:.2f} s, p99 {summary['delay_p99']:.2f} s"
    )
    table.caption = (
        f"timed out {summary['timed_out']}, pending {summary['pending']}; {delays}; "
        f"mean block budget used {summary['mean_block_used']:.3f}; "
        f"{summary['passes']} passes in {summary['runtime_s']:.2f} s"
    )
    return table


@app.command()
def simulate(
    workload: Annotated[str, typer.Argument(
        help="Workload (single-block, multi-block, macro with optional -rdp, heterogeneous) or trace file.")],
    out: Annotated[Path, typer.Option(help="Directory for result.json, summary.json and (with --plots) figures.")],
    policy: Annotated[str, typer.Option(
        help="Policy name (fcfs, rr-n, rr-t, dpf-n, dpf-t, dpack, dpack-n, dpack-t, optimal).")] = "dpf-n",
    n: Annotated[Optional[int], typer.Option("--n", help="N: per-arrival unlock divisor.")] = None,
    lifetime: Annotated[Optional[float], typer.Option(help="T: data lifetime in seconds (per-time unlock).")] = None,
    unlock: Annotated[Optional[str], typer.Option(help="Override the unlock rule: all, n or t.")] = None,
    k: Annotated[int, typer.Option(help="DPack: grants between efficiency refreshes.")] = 50,
    tick: Annotated[Optional[float], typer.Option(help="Per-time unlock period in seconds (default T/100).")] = None,
    seed: SeedOption = 0,
    duration: DurationOption = None,
    param: ParamOption = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Also draw the run's figures (PNG).")] = False,
) -> None:
    """Simulate a policy over a workload and write the result, a summary and (with --plots) figures."""
    from privsched.simulation.api import load_workload, resolve_policy, run

    with errors():
        spec = resolve_policy(policy, n=n, lifetime=lifetime, k=k, unlock=unlock)
        label, instance = load_workload(workload, seed=seed, duration=duration, **_params(param))
        result = run(label, instance, spec, tick=tick)
    summary = result.summary()
    out.mkdir(parents=True, exist_ok=True)
    result.save(out / "result.json")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if plots:
        from privsched.simulation.plots import result_figures

        result_figures(result, out)
    console.print(_summary_table(summary))
    console.print(f"wrote {out}/result.json, summary.json" + (" and plots" if plots else ""))


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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from privsched.simulation.api import resolve_policy
    from privsched.simulation.registry import workload_generators
    from privsched.simulation.sweep import grid, summary_table, write_sweep
    from privsched.simulation.sweep import sweep as run_sweep

    known = workload_generators()
    unknown = [w for w in workloads if w not in known]
    if unknown:
        fail(f"unknown workload {unknown[0]!r} (expected one of: {', '.join(known)})")
    if workers < 1:
        fail("--workers must be at least 1")
    ns, lifetimes = _numbers(n, int, "--n"), _numbers(lifetime, float, "--lifetime")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    with errors():
        for name in names:  # validates names and parameters before any run
            resolve_policy(name, n=ns[0] if ns else None, lifetime=lifetimes[0] if lifetimes else None)
        jobs = grid(workloads, names, ns, lifetimes, seed)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("sweep", total=len(jobs))

        def done(row: dict) -> None:
            progress.update(task, advance=1, description=f"{row['workload']}: {row['label']} → {row['granted']}")

        with errors():
            rows, best = run_sweep(jobs, workers=workers, params=_params(param), on_done=done)
    write_sweep(rows, best, out)
    console.print(summary_table(rows), markup=False)
    console.print(f"wrote {out}/sweep.json, summary.md and figures")


@app.command()
def trace(
    workload: Annotated[str, typer.Argument(help="Workload (single-block, multi-block, macro with optional -rdp, heterogeneous).")],
    out: Annotated[Path, typer.Option(help="Trace file to write (JSON).")],
    seed: SeedOption = 0,
    duration: DurationOption = None,
    param: ParamOption = None,
) -> None:
    """Save a generated workload as a trace file."""
    from privsched.simulation.registry import generate_workload, workload_generators
    from privsched.simulation.trace import save_trace

    params = _params(param)
    if duration is not None:
        params["duration"] = duration
    with errors():
        document = generate_workload(workload_generators(), workload, seed, params)
    save_trace(document, out)
    console.print(f"wrote {len(document.pipelines)} pipelines on {len(document.blocks)} blocks to {out}")
