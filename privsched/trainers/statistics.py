"""DP statistics ("mice", docs/design.md §5.2): counts, sums, means and histograms.

Each record contributes at most its value clipped to [lo, hi] (bounded contributions), so
the released quantities have the sensitivities of :meth:`StatisticJob.parts`; the noise is
the one the ledger charged: Laplace with scale b, or Gaussian with standard deviation σ
(Dwork & Roth 2014, Thm 3.6 and App. A). Count, sum and histogram are unbiased; a mean is
the ratio of a noisy sum and a noisy count (Composition, Thm 3.16), clipped to the bounds.
"""

from __future__ import annotations

import json

import numpy as np

from privsched.budgets.curves import gaussian_sigma
from privsched.budgets.mechanisms import Composed, EpsilonDelta, Gaussian, Laplace, Mechanism, demand_vector
from privsched.jobs.context import JobContext
from privsched.trainers.data import column, load_blocks
from privsched.trainers.plans import StatisticJob


def noise_of(part: Mechanism, sensitivity: float) -> tuple[str, float]:
    """(distribution, scale) of the noise one charged mechanism stands for."""
    if isinstance(part, Laplace):
        return "laplace", part.scale
    if isinstance(part, Gaussian):
        return "gaussian", part.sigma
    if isinstance(part, EpsilonDelta):
        return "gaussian", sensitivity * gaussian_sigma(part.epsilon, part.delta)
    raise ValueError(f"a statistic cannot be released with a {part.kind} mechanism")


def _exact(job: StatisticJob, name: str, values: np.ndarray | None, n: int) -> np.ndarray:
    if name == "count":
        return np.array([float(n)])
    lo, hi = job.bounds  # type: ignore[misc]
    clipped = np.clip(values, lo, hi)
    if name == "sum":
        return np.array([clipped.sum()])
    counts, _ = np.histogram(clipped, bins=job.bins, range=(lo, hi))
    return counts.astype(float)


def dp_statistic(
    job: StatisticJob, mechanism: Mechanism, values: np.ndarray | None, n: int, rng: np.random.Generator
) -> dict:
    """Release the job's statistic of ``values`` (``n`` records) with the charged noise.

    Returns ``{"value": ...}`` (a list of bin counts and ``"edges"`` for a histogram)."""
    parts = mechanism.parts if isinstance(mechanism, Composed) else [mechanism]
    specs = job.parts()
    if len(parts) != len(specs):
        raise ValueError(f"a {job.query} releases {len(specs)} quantities, the mechanism covers {len(parts)}")
    noisy = {}
    for (name, sensitivity), part in zip(specs, parts):
        exact = _exact(job, name, values, n)
        kind, scale = noise_of(part, sensitivity)
        noise = rng.laplace(0.0, scale, exact.shape) if kind == "laplace" else rng.normal(0.0, scale, exact.shape)
        noisy[name] = exact + noise
    if job.query == "histogram":
        lo, hi = job.bounds  # type: ignore[misc]
        return {"value": noisy["histogram"].tolist(), "edges": np.linspace(lo, hi, job.bins + 1).tolist()}
    if job.query == "mean":
        lo, hi = job.bounds  # type: ignore[misc]
        mean = noisy["sum"][0] / max(noisy["count"][0], 1.0)
        return {"value": float(np.clip(mean, lo, hi))}
    return {"value": float(noisy[job.query][0])}


def run_statistic(ctx: JobContext, job: StatisticJob, mechanism: Mechanism) -> None:
    """Compute the statistic over the granted blocks, save ``metrics.json``, report the
    result and the budget spent (the whole charged mechanism: a statistic is one release)."""
    records = load_blocks(ctx)
    n = len(next(v for k, v in records.items() if v.ndim >= 1))
    values = column(records, job.column) if job.column is not None else None
    result = dp_statistic(job, mechanism, values, n, np.random.default_rng(job.seed))
    metrics = {"query": job.query, "column": job.column, "mechanism": job.mechanism, "blocks": len(ctx.blocks), **result}
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    (ctx.workdir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    ctx.report_metrics(**metrics)
    ctx.report_spent(demand_vector(mechanism, ctx.accounting))
