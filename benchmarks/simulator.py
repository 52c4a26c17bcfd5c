"""Simulator speed against the published artifact's simulator (OSDI'21), as a markdown table.

    .venv/bin/python benchmarks/simulator.py [--repeats 3] [--reference]

Times are the event loop's (workload generation is reported apart), the best of
``--repeats`` runs, wall and CPU: on a shared machine the CPU time is the one that other
processes do not inflate. ``--reference`` also times the loop without its shortcuts (one
full policy pass at every instant) on the basic workload.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from privsched.simulation.api import load_workload, resolve_policy, run  # noqa: E402

#: (workload, policy, parameters, published simulator's time in seconds, target in seconds)
CASES = [
    ("multi-block", "dpf-n", {"n": 175}, 2.2, 0.2),
    ("multi-block-rdp", "fcfs", {}, 12.8, None),
    ("multi-block-rdp", "dpf-n", {"n": 14514}, 600.0, 10.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    cases = list(CASES)
    if args.reference:
        cases.append(("multi-block", "dpf-n", {"n": 175, "shortcuts": False}, 2.2, None))
    print(
        "| workload | policy | pipelines | granted | generation (s) | loop wall (s) | loop CPU (s) "
        "| published (s) | speed-up (CPU) | target (s) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    instances = {}
    for workload, policy, params, published, target in cases:
        params = dict(params)
        shortcuts = params.pop("shortcuts", True)
        if workload not in instances:
            started = time.perf_counter()
            instances[workload] = (load_workload(workload)[1], time.perf_counter() - started)
        instance, generation = instances[workload]
        spec = resolve_policy(policy, **params)
        results = [run(workload, instance, spec, shortcuts=shortcuts) for _ in range(args.repeats)]
        wall = min(r.runtime_s for r in results)
        cpu = min(r.cpu_s for r in results)
        label = f"{policy} {' '.join(f'{k}={v}' for k, v in params.items())}" + ("" if shortcuts else " (no shortcuts)")
        published_text = f"> {published:g}" if published >= 600 else f"{published:g}"
        print(
            f"| {workload} | {label.strip()} | {instance.n_pipelines} | {results[0].granted} | {generation:.2f} | "
            f"{wall:.2f} | {cpu:.2f} | {published_text} | {published / cpu:.1f}× | "
            f"{'' if target is None else format(target, 'g')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
