"""Releasing a DP statistic with the noise it was charged.

Each record contributes at most its value clipped to [lo, hi] (bounded contributions), so
the released quantities have the sensitivities of :meth:`StatisticJob.parts`. A value that
is NaN or ±inf is replaced by the lower bound lo before clipping, so one bad record moves a
release no more than any other record does and never makes it NaN.

The noise is the one the ledger charged, drawn by OpenDP from OS entropy with
floating-point-safe samplers (:mod:`privsched.statistics.noise`; Mironov, CCS 2012): Laplace
with scale b = Δ/ε (pure ε-DP, charged min(ε, αε²/2) under RDP) or Gaussian with standard
deviation σ (Dwork & Roth 2014, Thm 3.6; under basic accounting calibrated on the exact
(ε, δ) of the noise drawn: Canonne, Kamath & Steinke 2020, Thm 7 for the discrete Gaussian of
counts and histograms, Balle & Wang 2018 for sums).
Counts and histograms are released as integers. Before each quantity is released OpenDP's
own privacy map of its noise is checked against what was charged for it. A mean is the
ratio of a noisy sum and a noisy count (Composition, Dwork & Roth 2014 Thm 3.16), clipped
to the bounds.
"""

from __future__ import annotations

import math

import numpy as np

from privsched.budgets.curves import analytic_gaussian_sigma
from privsched.budgets.discrete_gaussian import discrete_gaussian_sigma, log_delta_bound
from privsched.budgets.mechanisms import Composed, EpsilonDelta, Gaussian, Laplace, Mechanism
from privsched.statistics.noise import laplace_scale, noisy, within_charge
from privsched.statistics.queries import StatisticJob


def noise_of(part: Mechanism, sensitivity: float, integer: bool = False) -> tuple[str, float]:
    """(distribution, scale) of the noise one charged mechanism stands for: Laplace for a
    Laplace scale or a pure ε (b = Δ/ε rounded up), Gaussian for σ or an (ε, δ > 0) under
    basic accounting. The σ of an (ε, δ) is calibrated on the exact guarantee of the noise
    OpenDP draws: the discrete Gaussian's for ``integer`` values (Canonne, Kamath & Steinke
    2020, Thm 7; integer Δ, rounded up), the continuous Gaussian's otherwise (the analytic
    Gaussian, Balle & Wang 2018)."""
    if isinstance(part, Laplace):
        return "laplace", part.scale
    if isinstance(part, Gaussian):
        return "gaussian", part.sigma
    if isinstance(part, EpsilonDelta):
        if part.delta == 0:
            return "laplace", laplace_scale(sensitivity, part.epsilon)
        if integer:
            return "gaussian", discrete_gaussian_sigma(part.epsilon, part.delta, math.ceil(sensitivity))
        return "gaussian", analytic_gaussian_sigma(part.epsilon, part.delta, sensitivity)
    raise ValueError(f"a statistic cannot be released with a {part.kind} mechanism")


def charged_loss(part: Mechanism, sensitivity: float, integer: bool = False) -> float:
    """The loss a part was charged in OpenDP's measure: ε for Laplace noise (max divergence;
    Δ_c/b for a Laplace charged at its own sensitivity Δ_c), ρ = Δ_c²/(2σ²) for a Gaussian
    charged by its RDP curve α·ρ (zero-concentrated divergence); an (ε, δ) Gaussian under
    basic accounting is checked at its calibrated σ, ρ of that σ at Δ (and its δ by
    :func:`check_exact_delta`). A mechanism charged at a smaller sensitivity than the
    release's Δ (a record's, for a person's K rows) is thus refused by the privacy map."""
    if isinstance(part, Laplace):
        return part.sensitivity / part.scale
    if isinstance(part, Gaussian):
        return part.sensitivity**2 / (2 * part.sigma**2)
    kind, scale = noise_of(part, sensitivity, integer)
    if kind == "laplace" and isinstance(part, EpsilonDelta):  # noise_of refused the other kinds
        return part.epsilon
    return sensitivity**2 / (2 * scale**2)


def check_exact_delta(part: Mechanism, kind: str, scale: float, integer: bool, sensitivity: float) -> None:
    """Raise ``ValueError`` unless the discrete Gaussian of standard deviation ``scale`` that
    an integer (ε, δ > 0) part draws is (ε, δ)-DP exactly (CKS 2020, Thm 7; the zCDP bound
    past what can be summed): the σ that is sampled, after OpenDP's rounding, is the one
    checked."""
    if not (integer and kind == "gaussian" and isinstance(part, EpsilonDelta) and part.delta > 0):
        return
    if log_delta_bound(scale, part.epsilon, math.ceil(sensitivity)) > math.log(part.delta):
        raise ValueError(f"discrete Gaussian noise of scale {scale:g} is not ({part.epsilon:g}, {part.delta:g})-DP")


def clipped(values: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """Values with NaN and ±inf replaced by the lower bound, then clipped to the bounds."""
    lo, hi = bounds
    return np.clip(np.where(np.isfinite(values), values, lo), lo, hi)


def _exact(job: StatisticJob, name: str, values: np.ndarray | None, n: int) -> tuple[np.ndarray, bool]:
    """The exact quantity and whether it is integer-valued (counts)."""
    if name == "count":
        return np.array([n]), True
    bounded = clipped(values, job.bounds)  # type: ignore[arg-type]
    if name == "sum":
        return np.array([bounded.sum()]), False
    assert job.bins is not None  # a histogram has bins (StatisticJob._check)
    counts, _ = np.histogram(bounded, bins=job.bins, range=job.bounds)
    return counts, True


def dp_statistic(job: StatisticJob, mechanism: Mechanism, values: np.ndarray | None, n: int, max_rows_per_user: int = 1) -> dict:
    """Release the job's statistic of ``values`` (``n`` records) with the charged noise, at
    the sensitivity of a person with at most ``max_rows_per_user`` rows among them (the
    dataset's contribution bound K, enforced on the rows before they reach here; 1 at event
    level): a count with K = 5 gets Laplace noise of scale 5/ε.

    Every part's noise is checked against its charge with OpenDP's privacy map before any
    part is released (:func:`~privsched.statistics.noise.within_charge`). Returns ``{"value": ...}``
    (a list of bin counts and ``"edges"`` for a histogram)."""
    parts = mechanism.parts if isinstance(mechanism, Composed) else [mechanism]
    specs = job.parts(max_rows_per_user)
    if len(parts) != len(specs):
        raise ValueError(f"a {job.query} releases {len(specs)} quantities, the mechanism covers {len(parts)}")
    plans = []
    for (name, sensitivity), part in zip(specs, parts):
        exact, integer = _exact(job, name, values, n)
        kind, scale = noise_of(part, sensitivity, integer)
        scale = within_charge(kind, scale, integer, exact.size, sensitivity, charged_loss(part, sensitivity, integer))
        check_exact_delta(part, kind, scale, integer, sensitivity)
        plans.append((name, exact, kind, scale, integer))
    released = {name: noisy(exact, kind, scale, integer) for name, exact, kind, scale, integer in plans}
    if job.query == "histogram":
        lo, hi = job.bounds  # type: ignore[misc]
        assert job.bins is not None  # a histogram has bins (StatisticJob._check)
        return {"value": released["histogram"].tolist(), "edges": np.linspace(lo, hi, job.bins + 1).tolist()}
    if job.query == "mean":
        lo, hi = job.bounds  # type: ignore[misc]
        mean = released["sum"][0] / max(released["count"][0], 1.0)
        return {"value": float(np.clip(mean, lo, hi))}
    return {"value": float(released[job.query][0])}
