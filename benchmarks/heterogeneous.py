"""DPack against DPF on the heterogeneous workload: what closes the gap between them.

    .venv/bin/python benchmarks/heterogeneous.py [--out docs/results/heterogeneous]

Writes ``investigation.md``. Tasks either keep their mechanism's own size (sizes 0.01–1,
the workload's default) or have controlled sizes, ε_min drawn from a normal(s, s/5)
truncated to (0.01, 1), as in the paper artifact's microbenchmarks (s = 0.05 there):

1. offline instances against the MILP optimum (every task waiting at once on fully
   unlocked blocks), DPack recounting every 50 grants (DESIGN's K) and after every grant
   (K = 1, the paper artifact's default for its microbenchmarks), seeds 0–2:
   a. one block, every task on it (the paper's σ_α sweep: one block per task), per size
      and best-order heterogeneity σ_α;
   b. 5 blocks, each task on the latest 1–5 (the workload's block-count distribution);
   c. 20 blocks, each task on the latest k, k of mean 10 and deviation σ_blocks (the
      paper's σ_blocks sweep, σ_α = 0), sizes 0.05 ± 0.01 only (with the mechanisms' own
      sizes the MILP takes minutes here);
2. online, DPF-T and DPack-T over lifetimes L, with the simulator's default unlock tick
   (a pass about every L/100 s) and with the tick equal to the 10 s submission batch (a
   pass only at each batch, as the paper's scheduler runs every scheduling period):
   a. controlled sizes s = 0.05 (seeds 0–2) and the mechanisms' own sizes (seed 0), per σ_α;
   b. every controlled size, per σ_α, one pass per batch, seed 0.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from privsched.policies import make_policy  # noqa: E402
from privsched.policies.dpack import DPack  # noqa: E402
from privsched.simulation.api import load_workload, resolve_policy, run  # noqa: E402
from privsched.simulation.offline import compare_offline  # noqa: E402

ALPHA_STDS = (0.0, 1.0, 2.0, math.inf)
SIZES = (0.02, 0.05, 0.1, 0.2)
PAPER_SIZE = 0.05
SEEDS = (0, 1, 2)
LIFETIMES = (10.0, 30.0, 60.0, 100.0, 200.0)
BLOCK_STDS = (0.0, 2.0, 4.0, 8.0)
BATCH = 10.0
TICKS = ((None, "~L/100 (default)"), (BATCH, f"{BATCH:g} s (batch)"))
OFFLINE_POLICIES = ("fcfs", "dpf", "k50", "k1")


def sizes(size_mean: float | None) -> dict:
    """Workload parameters of a controlled size (spread a fifth of the mean), or none."""
    return {} if size_mean is None else {"size_mean": size_mean, "size_std": size_mean / 5}


def size_label(size_mean: float | None) -> str:
    return "own" if size_mean is None else f"{size_mean:g} ± {size_mean / 5:g}"


def spread(values: list[float], fmt: str) -> str:
    """``low–high`` of per-seed values (one value when they agree)."""
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low}–{high}"


def offline_row(label: list[str], params: dict) -> str:
    """One offline setting over :data:`SEEDS`: granted totals, per-seed ratio and gaps."""
    runs = []
    for seed in SEEDS:
        _, instance = load_workload("heterogeneous", seed=seed, duration=1.0, rate=200.0, batch=None, **params)
        policies = {"fcfs": make_policy("fcfs").policy, "dpf": make_policy("dpf-n", n=1).policy,
                    "k50": DPack(k=50), "k1": DPack(k=1)}
        runs.append(compare_offline(instance, policies, time_limit=60.0))
    total = {p: sum(c.granted[p] for c in runs) for p in OFFLINE_POLICIES}
    ratio = [c.granted["k1"] / c.granted["dpf"] for c in runs]
    return (f"| {' | '.join(label)} | {sum(c.pipelines for c in runs)} | {sum(c.optimum for c in runs):g} | "
            f"{'yes' if all(c.proven_optimal for c in runs) else 'no'} | "
            + " | ".join(f"{total[p]:g}" for p in OFFLINE_POLICIES)
            + f" | {spread(ratio, '.2f')} | {spread([100 * max(c.gap('k1'), 0.0) for c in runs], '.0f')} | "
            f"{spread([100 * max(c.gap('dpf'), 0.0) for c in runs], '.0f')} |")


def offline_tables() -> dict[str, list[str]]:
    columns = ("| tasks | optimum | proven | FCFS | DPF | DPack K=50 | DPack K=1 | K=1 / DPF | K=1 gap % | DPF gap % |",
               "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    one = ["| size | σ_α " + columns[0], "|---|---:" + columns[1]]
    five = list(one)
    for size_mean in (None, *SIZES):
        for alpha_std in ALPHA_STDS:
            label = [size_label(size_mean), f"{alpha_std:g}"]
            one.append(offline_row(label, {"initial_blocks": 1, "max_blocks": 1, "blocks_mean": 1.0, "blocks_std": 0.0,
                                           "alpha_std": alpha_std, **sizes(size_mean)}))
            five.append(offline_row(label, {"initial_blocks": 5, "max_blocks": 5, "alpha_std": alpha_std,
                                            **sizes(size_mean)}))
            print(one[-1], five[-1], sep="\n", flush=True)
    wide = ["| size | σ_blocks " + columns[0], "|---|---:" + columns[1]]
    for blocks_std in BLOCK_STDS:
        wide.append(offline_row([size_label(PAPER_SIZE), f"{blocks_std:g}"], {
            "initial_blocks": 20, "max_blocks": 20, "blocks_mean": 10.0, "blocks_std": blocks_std,
            "alpha_std": 0.0, **sizes(PAPER_SIZE)}))
        print(wide[-1], flush=True)
    return {"one": one, "five": five, "wide": wide}


def online_run(size_mean: float | None, alpha_std: float, seed: int, tick: float | None) -> dict:
    """Granted count per (policy, lifetime) on the default-sized online workload."""
    _, instance = load_workload("heterogeneous", seed=seed, alpha_std=alpha_std, **sizes(size_mean))
    return {(p, lifetime): run("heterogeneous", instance, resolve_policy(p, lifetime=lifetime), tick=tick).granted
            for p in ("dpf-t", "dpack-t") for lifetime in LIFETIMES}


def online_row(label: list[str], granted: dict) -> str:
    """Equal-lifetime ratios DPack-T / DPF-T, then each policy's best over lifetimes."""
    ratios = " | ".join(f"{granted['dpack-t', lifetime] / granted['dpf-t', lifetime]:.2f}" for lifetime in LIFETIMES)
    best = {p: max(LIFETIMES, key=lambda lifetime: granted[p, lifetime]) for p in ("dpf-t", "dpack-t")}
    f, d = granted["dpf-t", best["dpf-t"]], granted["dpack-t", best["dpack-t"]]
    return (f"| {' | '.join(label)} | {ratios} | {f} ({best['dpf-t']:g}) | {d} ({best['dpack-t']:g}) | "
            f"**{d / f:.2f}** |")


def online_tables() -> dict[str, list[str]]:
    lifetimes = " | ".join(f"L={lifetime:g}" for lifetime in LIFETIMES)
    columns = f" | {lifetimes} | DPF-T best (L) | DPack-T best (L) | best / best |"
    rule = "|---:" * len(LIFETIMES) + "|---:|---:|---:|"
    seeded = ["| size | σ_α | pass every | seed" + columns, "|---|---:|---|---:" + rule]
    for size_mean in (PAPER_SIZE, None):
        for alpha_std in ALPHA_STDS:
            for tick, tick_label in TICKS:
                for seed in SEEDS if size_mean is not None else SEEDS[:1]:
                    granted = online_run(size_mean, alpha_std, seed, tick)
                    seeded.append(online_row([size_label(size_mean), f"{alpha_std:g}", tick_label, str(seed)], granted))
                    print(seeded[-1], flush=True)
    sizes_table = ["| size | σ_α" + columns, "|---|---:" + rule]
    for size_mean in SIZES:
        for alpha_std in ALPHA_STDS:
            granted = online_run(size_mean, alpha_std, 0, BATCH)
            sizes_table.append(online_row([size_label(size_mean), f"{alpha_std:g}"], granted))
            print(sizes_table[-1], flush=True)
    return {"seeded": seeded, "sizes": sizes_table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "heterogeneous")
    args = parser.parse_args()
    started = time.perf_counter()
    offline = offline_tables()
    online = online_tables()
    counts = f"totals over seeds {SEEDS[0]}–{SEEDS[-1]}; ratio and gaps: lowest–highest per seed"
    text = [
        "Sizes: `own` keeps each mechanism's size (0.01–1); `s ± s/5` scales every curve to an ε_min drawn "
        "from that normal truncated to (0.01, 1). Gap: (MILP bound − granted) / bound, the distance to the "
        "optimum when it is proven.", "",
        f"## Offline, one block ({counts})", "", *offline["one"], "",
        f"## Offline, 5 blocks, each task on the latest 1–5 ({counts})", "", *offline["five"], "",
        f"## Offline, 20 blocks, each task on the latest ~10, σ_α = 0 ({counts})", "", *offline["wide"], "",
        "## Online, per seed (DPack-T / DPF-T at equal L; best over L against best over L)", "",
        *online["seeded"], "",
        "## Online, every size, a pass per 10 s batch, seed 0", "", *online["sizes"], "",
        f"Generated by `benchmarks/heterogeneous.py` in {time.perf_counter() - started:.0f} s.", "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "investigation.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
