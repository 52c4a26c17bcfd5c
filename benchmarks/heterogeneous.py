"""DPack against DPF on the heterogeneous workload: what closes the gap between them.

    .venv/bin/python benchmarks/heterogeneous.py [--out docs/results/heterogeneous]

Writes ``investigation.md`` with three tables (seed 0):
1. offline, small instances (5 blocks, ~200 tasks) against the MILP optimum, per best-order
   heterogeneity σ_α, DPack recounting every 50 grants (DESIGN's K) and after every grant
   (K = 1, the paper artifact's default for its microbenchmarks);
2. online, per σ_α and lifetime L: DPF-T and DPack-T with the simulator's default unlock
   tick (a pass about every second) and with the tick equal to the 10 s submission batch
   (a pass only at each batch, as the paper's scheduler runs every scheduling period);
3. best against best per σ_α.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privsched.policies import make_policy  # noqa: E402
from privsched.policies.dpack import DPack  # noqa: E402
from privsched.simulation.api import load_workload, resolve_policy, run  # noqa: E402
from privsched.simulation.offline import compare_offline  # noqa: E402

ALPHA_STDS = (0.0, 1.0, 2.0, math.inf)
LIFETIMES = (30.0, 60.0, 100.0, 200.0)
BATCH = 10.0


def offline_table() -> list[str]:
    lines = ["| σ_α | tasks | optimum | proven | FCFS | DPF | DPack K=50 | DPack K=1 | DPack K=1 / DPF |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for alpha_std in ALPHA_STDS:
        _, instance = load_workload("heterogeneous", seed=0, duration=1.0, rate=200.0, initial_blocks=5,
                                    max_blocks=5, batch=None, alpha_std=alpha_std)
        policies = {"fcfs": make_policy("fcfs").policy, "dpf": make_policy("dpf-n", n=1).policy,
                    "k50": DPack(k=50), "k1": DPack(k=1)}
        c = compare_offline(instance, policies, time_limit=60.0)
        g = c.granted
        lines.append(f"| {alpha_std:g} | {c.pipelines} | {c.optimum:g} | {'yes' if c.proven_optimal else 'no'} | "
                     f"{g['fcfs']:g} | {g['dpf']:g} | {g['k50']:g} | {g['k1']:g} | {g['k1'] / g['dpf']:.2f} |")
        print(lines[-1], flush=True)
    return lines


def online_tables() -> tuple[list[str], list[str]]:
    rows = ["| σ_α | tasks | L (s) | pass every | DPF-T | DPack-T | ratio |", "|---:|---:|---:|---|---:|---:|---:|"]
    best = ["| σ_α | pass every | DPF-T best (L) | DPack-T best (L) | ratio |", "|---:|---|---:|---:|---:|"]
    for alpha_std in ALPHA_STDS:
        _, instance = load_workload("heterogeneous", seed=0, alpha_std=alpha_std)
        for tick, label in ((None, "~1 s (default)"), (BATCH, f"{BATCH:g} s (batch)")):
            top = {}
            for lifetime in LIFETIMES:
                granted = {p: run("heterogeneous", instance, resolve_policy(p, lifetime=lifetime), tick=tick).granted
                           for p in ("dpf-t", "dpack-t")}
                for p, g in granted.items():
                    if p not in top or g > top[p][0]:
                        top[p] = (g, lifetime)
                rows.append(f"| {alpha_std:g} | {instance.n_pipelines} | {lifetime:g} | {label} | "
                            f"{granted['dpf-t']} | {granted['dpack-t']} | {granted['dpack-t'] / granted['dpf-t']:.2f} |")
                print(rows[-1], flush=True)
            (f, fl), (d, dl) = top["dpf-t"], top["dpack-t"]
            best.append(f"| {alpha_std:g} | {label} | {f} ({fl:g}) | {d} ({dl:g}) | {d / f:.2f} |")
    return rows, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "heterogeneous")
    args = parser.parse_args()
    offline = offline_table()
    online, best = online_tables()
    text = ["## Offline, against the MILP optimum", "", *offline, "", "## Online, equal parameters", "", *online, "",
            "## Online, best against best", "", *best, ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "investigation.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
