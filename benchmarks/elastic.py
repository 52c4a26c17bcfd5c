"""Pipelines served and ε used on the macrobenchmark under RDP, fixed against elastic demands.

    .venv/bin/python benchmarks/elastic.py [--n 500,1000] [--elastic 0.5] [--days 50] [--pipelines-per-day 300] [--dpack]

The same trace (``macro-rdp``, seed 0) is simulated with fixed demands and with every
pipeline asking for the range [m·ε, ε] (``--elastic`` m; docs/design.md §4.2, elastic
demands), under DPF-N (and DPack-N with ``--dpack``) at each ``--n``. Elastic runs are
shown for three top-up rules: the registry's (topped up to the fair share 1/N), unbounded
(topped up to whatever is unlocked) and none (granted the minimum). ε used is the sum over
blocks of the ε at δ_G that a block's consumed curve stands for under the capacity rule the
blocks use (OSDI'21 §4.2, Mironov 2017 Prop. 3): min over orders α of
``consumed(α) + ln(1/δ_G)/(α − 1)``, 0 for a block nothing was granted on.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from privsched.policies import PolicySpec, make_policy  # noqa: E402
from privsched.policies.dpack import DPack  # noqa: E402
from privsched.policies.dpf import DominantPrivateBlockFairness  # noqa: E402
from privsched.simulation.api import load_workload  # noqa: E402
from privsched.simulation.engine import Simulator  # noqa: E402
from privsched.simulation.instance import Instance  # noqa: E402
from workloads.macrobenchmark import BLOCK_DELTA  # noqa: E402

#: Top-up rules compared: label -> the fair share given to the policy (None: unbounded; 0: none).
RULES = {"fair share (kept)": "registry", "unbounded": None, "minimum only": 0.0}


def epsilon_used(consumed: np.ndarray, alphas: tuple[float, ...], delta: float) -> float:
    """Σ over blocks of the ε at ``delta`` their consumed curves stand for (module docstring)."""
    a = np.asarray(alphas, dtype=float)
    per_block = np.min(consumed + math.log(1 / delta) / (a - 1), axis=1)
    return float(np.where(consumed.any(axis=1), per_block, 0.0).sum())


def spec_with(base: str, n: int, fair_share: float | None | str) -> PolicySpec:
    """The registry's policy, or the same policy with another top-up ceiling."""
    spec = make_policy(base, n=n)
    if fair_share == "registry":
        return spec
    policy = DPack(fair_share=fair_share) if base == "dpack-n" else DominantPrivateBlockFairness(name=base, fair_share=fair_share)  # type: ignore[arg-type]
    return PolicySpec(name=spec.name, policy=policy, unlock=spec.unlock, params=spec.params)


def row(label: str, instance: Instance, spec: PolicySpec) -> dict:
    started = time.process_time()
    simulator = Simulator(instance, spec, samples=0)
    state = simulator.run()
    granted = state.status == 2
    elephants = instance.klass == "elephants"
    return {
        "policy": spec.name,
        "n": spec.params["n"],
        "demands": label,
        "served": int(granted.sum()),
        "mice": int((granted & ~elephants).sum()),
        "elephants": int((granted & elephants).sum()),
        "epsilon": epsilon_used(state.consumed, instance.accounting.alphas, BLOCK_DELTA),
        "fraction": float(np.mean(state.fraction[granted])) if granted.any() else math.nan,
        "cpu_s": time.process_time() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="500", help="comma-separated N of DPF-N (default 500)")
    parser.add_argument("--elastic", type=float, default=0.5, help="the ranges' smallest fraction m (default 0.5)")
    parser.add_argument("--days", type=int, default=50)
    parser.add_argument("--pipelines-per-day", type=float, default=300.0)
    parser.add_argument("--dpack", action="store_true", help="also DPack-N (slower)")
    args = parser.parse_args()
    size = {"days": args.days, "pipelines_per_day": args.pipelines_per_day}
    _, fixed = load_workload("macro-rdp", seed=0, **size)
    _, elastic = load_workload("macro-rdp", seed=0, elastic=args.elastic, **size)
    print(f"macro-rdp, seed 0: {fixed.n_pipelines:,} pipelines on {fixed.n_blocks} blocks; elastic ranges [{args.elastic:g}·ε, ε]\n")
    print("| policy | N | demands | served (mice + elephants) | vs fixed | ε used at δ_G | vs fixed | mean fraction granted | CPU s |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for base in ["dpf-n"] + (["dpack-n"] if args.dpack else []):
        for n in (int(v) for v in args.n.split(",")):
            reference = row("fixed", fixed, make_policy(base, n=n))
            show(reference, reference)
            for label, share in RULES.items():
                show(row(f"elastic, top-up: {label}", elastic, spec_with(base, n, share)), reference)


def show(r: dict, reference: dict) -> None:
    """One row of the table, against the fixed-demand run."""
    print(
        f"| {r['policy']} | {r['n']} | {r['demands']} | {r['served']:,} ({r['mice']:,} + {r['elephants']:,}) "
        f"| {r['served'] / reference['served']:.3f}× | {r['epsilon']:.1f} | {r['epsilon'] / reference['epsilon']:.3f}× "
        f"| {r['fraction']:.3f} | {r['cpu_s']:.1f} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
