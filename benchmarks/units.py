"""Pipelines granted on the macrobenchmark under each unit of privacy, DPF and DPack.

    .venv/bin/python benchmarks/units.py [--days 20] [--per-day 300] [--n 100,300,500,1000,2000,all]

The workload is ``macro-rdp`` (workloads/macrobenchmark.py) on the blocks of each unit:
``event`` (a block a day), ``user-time`` (user partitions × days; statistics at a contribution
bound of K rows a person and day) and ``user`` (user blocks holding each person's whole
history, every pipeline asking for all of them). Each policy runs at every N of ``--n``
(DPF-N and DPack-N, budget unlocked 1/N per arriving pipeline; ``all``: the workload's number
of pipelines, a block's budget unlocked over the whole run) and its best is shown, with the
ratio to the same policy under ``event``. PrivateKube (Luo et al., OSDI'21 §6.2) granted
about 13.8k, 10.4k and 6.7k of ≈ 15k pipelines with DPF: ratios 0.75 and 0.49.

Where every pipeline asks one same block (``user``: every user block), the column "bound"
is the most pipelines any policy could grant (:func:`one_block_bound`); elsewhere "—".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from privsched.simulation.api import load_workload, resolve_policy, run  # noqa: E402
from privsched.simulation.instance import Instance  # noqa: E402

#: (label, workload parameters) of each unit's row; the first is the baseline.
UNITS = [
    ("event", {"unit": "event"}),
    ("user-time, K = 1", {"unit": "user-time", "rows_per_user": 1}),
    ("user-time, K = 2", {"unit": "user-time", "rows_per_user": 2}),
    ("user-time, K = 3", {"unit": "user-time", "rows_per_user": 3}),
    ("user", {"unit": "user"}),
]
POLICIES = ("dpf-n", "dpack-n")
#: PrivateKube's DPF grants per unit (OSDI'21 §6.2, ≈ 15k pipelines).
PRIVATEKUBE = {"event": 13.8e3, "user-time": 10.4e3, "user": 6.7e3}


def one_block_bound(instance: Instance) -> int | None:
    """When every pipeline asks block 0, the most pipelines any policy can grant: the granted
    ones all fit block 0's capacity at one order α at least (the ledger's invariant,
    docs/design.md §3.3, their whole demands consumed as the simulator consumes them), and at
    an order the most demands that fit are the smallest; so the largest smallest-first prefix
    over the live orders. None when some pipeline does not ask block 0."""
    on_first = instance.edge_block == 0
    if int(on_first.sum()) != instance.n_pipelines:
        return None
    demands, capacity = instance.edge_demand[on_first], instance.capacity[0]
    return max(int((np.cumsum(np.sort(demands[:, k])) <= capacity[k]).sum()) for k in range(len(capacity)) if capacity[k] > 0)


def best(params: dict, days: int, per_day: float, ns: list[str]) -> tuple[int, dict[str, tuple[int, int]], int | None, float]:
    """The pipelines of the workload, per policy its most granted and the N reaching it (the
    smallest, on a tie), and the bound of :func:`one_block_bound`."""
    name, instance = load_workload("macro-rdp", days=days, pipelines_per_day=per_day, **params)
    started = time.process_time()
    values = sorted({instance.n_pipelines if n == "all" else int(n) for n in ns})
    results = {}
    for policy in POLICIES:
        runs = [(run(name, instance, resolve_policy(policy, n=n)).granted, n) for n in values]
        results[policy] = max(runs, key=lambda r: (r[0], -r[1]))
    return instance.n_pipelines, results, one_block_bound(instance), time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--per-day", type=float, default=300.0)
    parser.add_argument(
        "--n", default="100,300,500,1000,2000,all", help="N values of DPF-N and DPack-N, comma-separated ('all': every pipeline)"
    )
    args = parser.parse_args()
    ns = args.n.split(",")
    print(f"macro-rdp, {args.days} days at {args.per_day:g} pipelines a day, best N of {ns}")
    columns = "DPF (N) | DPack (N) | bound | DPF / event | DPack / event | DPack / DPF | PrivateKube DPF / event | CPU (s)"
    print(f"| unit | pipelines | {columns} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    baseline: dict[str, int] = {}
    for label, params in UNITS:
        pipelines, results, bound, cpu = best(params, args.days, args.per_day, ns)
        (dpf, dpf_n), (dpack, dpack_n) = results["dpf-n"], results["dpack-n"]
        baseline = baseline or {"dpf-n": dpf, "dpack-n": dpack}
        published = PRIVATEKUBE[label.split(",")[0]] / PRIVATEKUBE["event"]
        print(
            f"| {label} | {pipelines} | {dpf} ({dpf_n}) | {dpack} ({dpack_n}) | {'—' if bound is None else bound} | "
            f"{dpf / baseline['dpf-n']:.2f} | "
            f"{dpack / baseline['dpack-n']:.2f} | {dpack / max(dpf, 1):.2f} | {published:.2f} | {cpu:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
