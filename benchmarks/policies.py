"""Speed of one allocation pass of each policy on a synthetic RDP snapshot.

The workload follows docs/design.md §5.3: blocks of (ε_G, δ_G) = (10, 1e-7) under the paper's RDP
capacity rule, each at a different stage of unlocking, and pipelines asking for the last
1–10 blocks of a random window with demands mixing Gaussian, Laplace and composed curves,
so blocks differ in their best order. Demands shrink as the queue grows (scale
``4 × blocks / pipelines``), so every size is oversubscribed alike and about half the queue
is granted in the pass. A naive per-pipeline loop over the same DPF order (the reference
walk of the tests) runs in the same process as the baseline. The last two columns are DPF's
and DPack's growth exponents between consecutive sizes, ``log(t₂/t₁) / log(n₂/n₁)`` on CPU
time: 1 is linear, 2 quadratic.

``--blocks`` changes the number of blocks (default 1,000), ``--pipelines-per-block`` scales
them with the queue instead (blocks = pending / that), and ``--k`` changes DPack's grants
between refreshes (default 50): together they separate what grows with the pipelines per
block from what grows with the number of rounds.

Run from the repository root: ``.venv/bin/python benchmarks/policies.py [--quick | --sizes 10000,30000,100000]``.
"""

from __future__ import annotations

import argparse
import math
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


def timed(run, repeats: int) -> tuple[float, float, object]:
    """Median wall and CPU time of ``repeats`` runs in milliseconds, and the last result.

    CPU time is the process's own; on a shared machine it is the steadier of the two."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = run()
        walls.append((time.perf_counter() - wall) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return statistics.median(walls), statistics.median(cpus), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 1k and 10k sizes")
    parser.add_argument("--sizes", help="comma-separated pending counts (default 1k, 3k, 10k, 30k, 100k)")
    blocks = parser.add_mutually_exclusive_group()
    blocks.add_argument("--blocks", type=int, default=1_000, help="blocks in every snapshot (default 1000)")
    blocks.add_argument("--pipelines-per-block", type=int, help="scale the blocks with the queue: pending / this")
    parser.add_argument("--k", type=int, default=50, help="DPack's grants between refreshes (default 50)")
    args = parser.parse_args()
    if args.blocks < 1 or args.k < 1 or (args.pipelines_per_block is not None and args.pipelines_per_block < 1):
        parser.error("--blocks, --pipelines-per-block and --k must be positive")
    sizes = (1_000, 10_000) if args.quick else (1_000, 3_000, 10_000, 30_000, 100_000)
    if args.sizes:
        try:
            sizes = tuple(int(size) for size in args.sizes.split(","))
        except ValueError:
            parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
        if any(size < 1 for size in sizes):
            parser.error("--sizes must be positive")
    policies = {name: make_policy(name, n=100, k=args.k).policy for name in ("fcfs", "dpf-n", "dpack")}
    layout = f"pending / {args.pipelines_per_block} blocks" if args.pipelines_per_block else f"{args.blocks:,} blocks"
    print(f"{layout}, DPack k = {args.k}\n")
    print(
        "| pending | edges | granted FCFS / DPF / DPack | FCFS ms | DPF ms | DPack ms | naive DPF loop ms "
        "| DPack/DPF | naive/DPF | DPF growth | DPack growth |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    previous: tuple[int, float, float] | None = None
    for n in sizes:
        n_blocks = max(1, n // args.pipelines_per_block) if args.pipelines_per_block else args.blocks
        snapshot = synthetic_snapshot(n, n_blocks)
        repeats = 5 if n < 100_000 else 3
        results = {name: timed(lambda p=policy: p.allocate(snapshot), repeats) for name, policy in policies.items()}
        naive_wall, naive_cpu, naive = timed(lambda: naive_admit(snapshot, dpf_order(snapshot)), 1)
        assert np.array_equal(naive, results["dpf-n"][2].granted), "vectorised and naive DPF passes disagree"
        cell = {name: f"{wall:.0f} ({cpu:.0f})" for name, (wall, cpu, _) in results.items()}
        granted = " / ".join(f"{len(results[name][2].granted):,}" for name in policies)
        dpf_cpu, dpack_cpu = results["dpf-n"][1], results["dpack"][1]
        dpf_growth = f"n^{math.log(dpf_cpu / previous[1]) / math.log(n / previous[0]):.2f}" if previous else ""
        growth = f"n^{math.log(dpack_cpu / previous[2]) / math.log(n / previous[0]):.2f}" if previous else ""
        previous = (n, dpf_cpu, dpack_cpu)
        print(
            f"| {n:,} | {len(snapshot.edge_block):,} | {granted} | {cell['fcfs']} | {cell['dpf-n']} | {cell['dpack']} "
            f"| {naive_wall:.0f} ({naive_cpu:.0f}) | {dpack_cpu / dpf_cpu:.1f}× | {naive_cpu / dpf_cpu:.1f}× | {dpf_growth} | {growth} |"
        )
    print("\nTimes: median wall-clock ms (process CPU ms in parentheses); ratios and growth use CPU time.")


if __name__ == "__main__":
    main()
