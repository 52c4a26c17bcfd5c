"""Figures of simulation results, in the style of Luo et al. (OSDI'21 §6): granted pipelines
against N or T per policy, delay CDFs, and budget used per block over time.

matplotlib is imported inside each function (Agg backend), so importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from privsched.simulation.results import SimulationResult


#: Line styles that keep overlapping curves (DPack on DPF) visible.
_STYLES = (
    {"marker": "o", "ms": 5, "ls": "-"},
    {"marker": "x", "ms": 7, "ls": "--"},
    {"marker": "s", "ms": 4, "ls": ":"},
    {"marker": "^", "ms": 5, "ls": "-."},
    {"marker": "d", "ms": 5, "ls": "-"},
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values: np.ndarray, label: str) -> None:
    values = np.sort(np.asarray(values, dtype=float))
    if values.size:
        ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=label)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def delay_cdf(results: Sequence[SimulationResult], labels: Sequence[str], path: Path, title: str = "") -> Path:
    """CDF of the scheduling delay (grant − arrival) of granted pipelines, one line per run."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for result, label in zip(results, labels):
        _cdf(ax, result.delays, f"{label} ({result.granted} granted)")
    ax.set_xlabel("scheduling delay (s)")
    ax.set_ylabel("fraction of granted pipelines")
    ax.set_title(title or "delay CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def budget_over_time(result: SimulationResult, path: Path, title: str = "") -> Path:
    """Share of each block's budget used over time (one row per block)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    times = result.sample_times
    used = np.asarray(result.sample_used).T  # (B, S)
    extent = (times[0], times[-1], -0.5, used.shape[0] - 0.5) if times.size else None
    image = ax.imshow(used, aspect="auto", origin="lower", extent=extent, vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="share of budget used")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("block")
    ax.set_title(title or f"budget used per block: {result.policy} on {result.workload}")
    return _save(fig, path)


def granted_by_class(result: SimulationResult, path: Path) -> Path:
    """Granted and submitted pipelines per class."""
    plt = _pyplot()
    classes = result.summary()["by_class"]
    names = list(classes)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    x = np.arange(len(names))
    ax.bar(x - 0.2, [classes[n]["pipelines"] for n in names], 0.4, label="submitted")
    ax.bar(x + 0.2, [classes[n]["granted"] for n in names], 0.4, label="granted")
    ax.set_xticks(x, names)
    ax.set_ylabel("pipelines")
    ax.set_title(f"{result.policy} on {result.workload}")
    ax.legend()
    return _save(fig, path)


def result_figures(result: SimulationResult, out: Path) -> list[Path]:
    """The figures of one run, written into ``out``."""
    return [
        delay_cdf([result], [result.policy], out / "delay_cdf.png"),
        budget_over_time(result, out / "budget_over_time.png"),
        granted_by_class(result, out / "granted_by_class.png"),
    ]


def granted_vs_parameter(rows: Sequence[dict], workload: str, path: Path) -> Path:
    """Granted pipelines against N (left) and T (right) per policy; parameterless policies as lines."""
    plt = _pyplot()
    rows = [r for r in rows if r["workload"] == workload]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, label in ((axes[0], "n", "N (pipelines per fair share)"), (axes[1], "lifetime", "T, data lifetime (s)")):
        ax.set_xscale("log")
        policies = sorted({r["policy"] for r in rows if r.get(key) is not None})
        for i, policy in enumerate(policies):
            mine = sorted((r for r in rows if r["policy"] == policy and r.get(key) is not None), key=lambda r: r[key])
            ax.plot([r[key] for r in mine], [r["granted"] for r in mine], label=policy, **_STYLES[i % len(_STYLES)])
        for r in rows:
            if r.get("n") is None and r.get("lifetime") is None:
                ax.axhline(r["granted"], ls="--", lw=1, color="gray")
                ax.annotate(r["policy"], (0.01, r["granted"]), xycoords=("axes fraction", "data"), fontsize=8)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
        if policies:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("granted pipelines")
    fig.suptitle(workload)
    return _save(fig, path)
