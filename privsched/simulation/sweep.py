"""Parameter sweeps: every (workload, policy, N or T) run in worker processes, then the
paper-style figures (Luo et al., OSDI'21 Figs. 6–8).

Policies ending in ``-n`` take each N, those ending in ``-t`` each T, ``dpack`` each N when
N values are given (else each T), and ``fcfs`` / ``optimal`` run once. Round robin is
defined for basic accounting only and is left out of RDP workloads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from privsched.simulation.results import SimulationResult


@dataclass(frozen=True)
class SweepPoint:
    workload: str
    policy: str
    n: int | None = None
    lifetime: float | None = None
    seed: int = 0

    @property
    def label(self) -> str:
        if self.n is not None:
            return f"{self.policy} N={self.n}"
        if self.lifetime is not None:
            return f"{self.policy} T={self.lifetime:g}"
        return self.policy


def _is_rdp(workload: str) -> bool:
    return workload.endswith("-rdp") or workload == "heterogeneous"


def grid(
    workloads: Sequence[str], policies: Sequence[str], ns: Sequence[int], lifetimes: Sequence[float], seed: int = 0
) -> list[SweepPoint]:
    """The points of a sweep, in a stable order."""
    points = []
    for workload in workloads:
        for policy in policies:
            if policy.startswith("rr") and _is_rdp(workload):
                continue
            per_n = policy.endswith("-n") or (policy == "dpack" and bool(ns))
            per_t = policy.endswith("-t") or (policy == "dpack" and not ns)
            if per_n:
                if not ns:
                    raise ValueError(f"policy {policy!r} needs --n values")
                points += [SweepPoint(workload, policy, n=n, seed=seed) for n in ns]
            elif per_t:
                if not lifetimes:
                    raise ValueError(f"policy {policy!r} needs --lifetime values")
                points += [SweepPoint(workload, policy, lifetime=t, seed=seed) for t in lifetimes]
            else:
                points.append(SweepPoint(workload, policy, seed=seed))
    return points


@lru_cache(maxsize=4)
def _instance(workload: str, seed: int, params: str):
    from privsched.simulation.api import load_workload

    return load_workload(workload, seed=seed, **json.loads(params))[1]


def simulate_point(point: SweepPoint, params: str = "{}") -> tuple[dict, SimulationResult]:
    """Run one point (in a worker); returns its summary row and its result."""
    from privsched.simulation.api import resolve_policy, run

    spec = resolve_policy(point.policy, n=point.n, lifetime=point.lifetime)
    result = run(point.workload, _instance(point.workload, point.seed, params), spec)
    summary = result.summary()
    row = {**asdict(point), "label": point.label}
    row.update(
        {
            k: summary[k]
            for k in (
                "pipelines",
                "granted",
                "timed_out",
                "by_class",
                "delay_p50",
                "delay_p99",
                "mean_block_used",
                "passes",
                "runtime_s",
                "cpu_s",
            )
        }
    )
    return row, _compact(result)


def _compact(result: SimulationResult) -> SimulationResult:
    """The result without per-pipeline lists (only what the figures need), cheap to pickle."""
    granted = result.granted_mask
    return SimulationResult(
        workload=result.workload,
        policy=result.policy,
        params=result.params,
        accounting=result.accounting,
        pipeline_ids=[],
        arrival=result.arrival[granted],
        status=["granted"] * int(granted.sum()),
        grant_time=result.grant_time[granted],
        klass=[k for k, g in zip(result.klass, granted) if g],
        block_ids=result.block_ids,
        block_used=result.block_used,
        sample_times=result.sample_times,
        sample_used=result.sample_used,
        block_wasted=result.block_wasted,
        passes=result.passes,
        runtime_s=result.runtime_s,
        cpu_s=result.cpu_s,
    )


def sweep(
    points: Sequence[SweepPoint],
    *,
    workers: int = 2,
    params: dict | None = None,
    on_done: Callable[[dict], None] | None = None,
) -> tuple[list[dict], dict[tuple[str, str], SimulationResult]]:
    """Run ``points`` over ``workers`` processes. Returns the summary rows (in point order) and,
    per (workload, policy), the result of its best run (most granted, smallest parameter)."""
    encoded = json.dumps(params or {}, sort_keys=True)
    rows: dict[SweepPoint, dict] = {}
    best: dict[tuple[str, str], tuple[dict, SimulationResult]] = {}

    def record(point: SweepPoint, row: dict, result: SimulationResult) -> None:
        rows[point] = row
        key = (point.workload, point.policy)
        if key not in best or row["granted"] > best[key][0]["granted"]:
            best[key] = (row, result)
        if on_done:
            on_done(row)

    if workers <= 1:
        for point in points:
            record(point, *simulate_point(point, encoded))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(simulate_point, point, encoded): point for point in points}
            for future in as_completed(futures):
                record(futures[future], *future.result())
    return [rows[point] for point in points], {key: result for key, (_, result) in best.items()}


def sweep_figures(rows: Sequence[dict], best: dict[tuple[str, str], SimulationResult], out: Path) -> list[Path]:
    """Per workload: granted vs N / T, delay CDFs and budget over time at each policy's best run."""
    from privsched.simulation import plots

    paths = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        paths.append(plots.granted_vs_parameter(rows, workload, out / f"granted_{workload}.png"))
        mine = sorted(((policy, result) for (w, policy), result in best.items() if w == workload))
        labels = [f"{policy} {_best_label(rows, workload, policy)}" for policy, _ in mine]
        paths.append(
            plots.delay_cdf(
                [r for _, r in mine],
                labels,
                out / f"delay_cdf_{workload}.png",
                title=f"delay CDF at each policy's best parameter: {workload}",
            )
        )
        for policy, result in mine:
            paths.append(plots.budget_over_time(result, out / f"budget_{workload}_{policy}.png"))
    return paths


def _best_label(rows: Sequence[dict], workload: str, policy: str) -> str:
    mine = [r for r in rows if r["workload"] == workload and r["policy"] == policy]
    top = max(mine, key=lambda r: r["granted"])
    return top["label"].removeprefix(policy).strip()


def summary_table(rows: Sequence[dict]) -> str:
    """The sweep as a markdown table."""
    lines = [
        "| workload | policy | N | T | granted | of | delay p50 (s) | delay p99 (s) | CPU (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        p50 = "" if r["delay_p50"] is None else f"{r['delay_p50']:.2f}"
        p99 = "" if r["delay_p99"] is None else f"{r['delay_p99']:.2f}"
        lines.append(
            f"| {r['workload']} | {r['policy']} | {'' if r['n'] is None else r['n']} | "
            f"{'' if r['lifetime'] is None else format(r['lifetime'], 'g')} | {r['granted']} | {r['pipelines']} | "
            f"{p50} | {p99} | {r['cpu_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def best_rows(rows: Sequence[dict]) -> list[dict]:
    """Each (workload, policy)'s run with the most grants (ties: the first in point order)."""
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (r["workload"], r["policy"])
        if key not in best or r["granted"] > best[key]["granted"]:
            best[key] = r
    return list(best.values())


def write_sweep(rows: Sequence[dict], best: dict, out: Path) -> list[Path]:
    """``sweep.json``, ``summary.md`` and the figures, into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(list(rows), indent=1))
    (out / "summary.md").write_text(summary_table(rows) + "\nBest run per policy:\n\n" + summary_table(best_rows(rows)))
    return [out / "sweep.json", out / "summary.md", *sweep_figures(rows, best, out)]
