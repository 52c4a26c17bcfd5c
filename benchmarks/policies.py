"""Speed of one allocation pass of each policy on a synthetic RDP snapshot.

The workload follows DESIGN §5.3: blocks of (ε_G, δ_G) = (10, 1e-7) under the paper's RDP
capacity rule, each at a different stage of unlocking, and pipelines asking for the last
1–10 blocks of a random window with demands mixing Gaussian, Laplace and composed curves,
so blocks differ in their best order. A naive per-pipeline loop over the same DPF order
(the reference walk of the tests) runs in the same process as the baseline.

Run from the repository root: ``.venv/bin/python benchmarks/policies.py [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from privsched.budgets.accounting import Accounting  # noqa: E402
from privsched.budgets.capacity import block_capacity  # noqa: E402
from privsched.budgets.curves import gaussian_curve, gaussian_sigma, laplace_curve  # noqa: E402
from privsched.policies import Snapshot, make_policy  # noqa: E402
from privsched.policies.dpf import dpf_order  # noqa: E402
from tests.test_policies_admission import naive_admit  # noqa: E402


def demand_palette(accounting: Accounting) -> np.ndarray:
    """Demand curves of common mechanisms: Gaussian and Laplace at several ε, and their sums."""
    alphas = accounting.alphas
    gaussians = [gaussian_curve(gaussian_sigma(eps, 1e-9), alphas) for eps in (0.5, 1.0, 2.0, 4.0)]
    laplaces = [laplace_curve(1.0 / eps, alphas) for eps in (0.1, 0.5, 1.0, 2.0)]
    mixed = [g + lap for g in gaussians[:2] for lap in laplaces[1:3]]
    return np.array(gaussians + laplaces + mixed)


def synthetic_snapshot(n_pipelines: int, n_blocks: int, max_blocks: int = 10, seed: int = 0) -> Snapshot:
    """A pending queue of ``n_pipelines`` over ``n_blocks`` RDP blocks (12 orders)."""
    rng = np.random.default_rng(seed)
    accounting = Accounting.rdp()
    capacity = np.tile(block_capacity(accounting, 10.0, 1e-7), (n_blocks, 1))
    unlocked = capacity * rng.uniform(0.2, 1.0, size=(n_blocks, 1))
    palette = demand_palette(accounting)
    count = rng.integers(1, max_blocks + 1, size=n_pipelines)
    last = rng.integers(0, n_blocks, size=n_pipelines)
    owner = np.repeat(np.arange(n_pipelines), count)
    offset = np.arange(owner.size) - np.repeat(np.cumsum(count) - count, count)
    blocks = (last[owner] - offset) % n_blocks
    curve = rng.integers(0, len(palette), size=n_pipelines)
    scale = rng.uniform(0.5, 2.0, size=n_pipelines) * n_blocks / n_pipelines * 4
    demand = palette[curve[owner]] * scale[owner, None]
    order = np.lexsort((blocks, owner))  # edges grouped by pipeline
    return Snapshot(
        accounting=accounting,
        capacity=capacity,
        unlocked=unlocked,
        pipeline_ids=np.array([f"p{i:06d}" for i in range(n_pipelines)]),
        arrival=rng.uniform(0, 1000, size=n_pipelines),
        weight=np.ones(n_pipelines),
        edge_pipeline=owner[order],
        edge_block=blocks[order],
        edge_demand=demand[order],
    )


def best_time(run, repeats: int) -> tuple[float, object]:
    """Median wall time of ``repeats`` runs in milliseconds, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 1k and 10k sizes, one repeat")
    args = parser.parse_args()
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    dpf = make_policy("dpf-n", n=100).policy
    dpack = make_policy("dpack", n=100).policy
    fcfs = make_policy("fcfs").policy
    print("| pending | edges | FCFS ms | DPF ms | DPack ms | naive DPF loop ms | DPack/DPF | naive/DPF | granted FCFS / DPF / DPack |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in sizes:
        snapshot = synthetic_snapshot(n, 1_000)
        repeats = 1 if args.quick or n >= 100_000 else 5
        t_fcfs, a_fcfs = best_time(lambda: fcfs.allocate(snapshot), repeats)
        t_dpf, a_dpf = best_time(lambda: dpf.allocate(snapshot), repeats)
        t_dpack, a_dpack = best_time(lambda: dpack.allocate(snapshot), repeats)
        t_naive, naive = best_time(lambda: naive_admit(snapshot, dpf_order(snapshot)), 1)
        assert np.array_equal(naive, a_dpf.granted), "vectorised and naive DPF passes disagree"
        print(
            f"| {n:,} | {len(snapshot.edge_block):,} | {t_fcfs:.0f} | {t_dpf:.0f} | {t_dpack:.0f} | {t_naive:.0f} "
            f"| {t_dpack / t_dpf:.1f}× | {t_naive / t_dpf:.1f}× "
            f"| {len(a_fcfs.granted):,} / {len(a_dpf.granted):,} / {len(a_dpack.granted):,} |"
        )


if __name__ == "__main__":
    main()
