"""A DPack-style heterogeneous RDP workload (Tholoniat et al., EuroSys'25 §6; DESIGN §5.3).

Pipelines mix mechanisms whose RDP curves are cheapest, relative to a block's capacity
curve, at different orders α, so that which order a block ends up "using" matters:
- Laplace (flat curve): best at large α (64 for ε ≥ 0.5);
- Gaussian (linear curve): best around α = 5;
- subsampled Gaussian (DP-SGD with strong amplification, q = 0.005, noise 0.6; very
  steep): best at α = 3, by far the cheapest there, prohibitive at large α;
- the composition of a Gaussian and a Laplace: in between (α ≈ 8).
Each pipeline's size is its *best-order share*, ``min_α d(α) / capacity(α)``, drawn per
family (see :data:`SIZES`); the mechanism's parameter is solved to match it. DPF ranks by
the *largest* share over orders, so it puts the DP-SGD plans last although a block filled
at α = 3 holds many of them: the heterogeneity DPack exploits. Blocks hold ε_G = 10,
δ_G = 1e-7 and arrive every 10 s (10 at time 0); pipelines arrive as a Poisson process and
ask for the last 1 (p = 0.5), 2 or 5 blocks. By default they are submitted in batches at
the end of each 10-second window (``batch``), as a periodic submitter would; ``batch=None``
keeps the Poisson times.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from privsched.budgets.accounting import DEFAULT_ALPHAS
from privsched.budgets.capacity import rdp_capacity
from privsched.budgets.curves import gaussian_curve, laplace_curve, subsampled_gaussian_curve
from privsched.simulation.trace import Trace, parse_trace
from workloads.microbenchmarks import periodic_blocks, poisson_arrivals

BLOCK_EPSILON, BLOCK_DELTA = 10.0, 1e-7
FAMILIES = ("laplace", "gaussian", "subsampled", "composed")
#: Best-order shares per family, drawn uniformly. DP-SGD plans are the cheapest at their best
#: order and the most expensive at large orders: DPF's dominant share ranks them last.
SIZES = {
    "laplace": (0.005, 0.01, 0.02, 0.05),
    "gaussian": (0.005, 0.01, 0.02, 0.05),
    "subsampled": (0.0005, 0.001, 0.002, 0.005),
    "composed": (0.005, 0.01, 0.02, 0.05),
}
BLOCK_COUNTS, BLOCK_WEIGHTS = (1, 2, 5), (0.5, 0.3, 0.2)
SAMPLE_RATE, NOISE = 0.005, 0.6  # one step: best order α = 3, ~20,000× dearer at α = 64


def _capacity() -> np.ndarray:
    return rdp_capacity(BLOCK_EPSILON, BLOCK_DELTA, DEFAULT_ALPHAS)


def best_share(curve: np.ndarray) -> float:
    """``min`` over live orders of ``d(α) / capacity(α)`` on a default block."""
    cap = _capacity()
    live = cap > 0
    return float(np.min(curve[live] / cap[live]))


@lru_cache(maxsize=None)
def mechanism(family: str, share: float) -> dict:
    """The description of a ``family`` mechanism whose best-order share is ``share``."""
    alphas = DEFAULT_ALPHAS
    if family == "gaussian":
        # d(α) = α / (2σ²): the share scales as 1/σ².
        return {"kind": "gaussian", "sigma": float(np.sqrt(best_share(gaussian_curve(1.0, alphas)) / share))}
    if family == "subsampled":
        one_step = best_share(subsampled_gaussian_curve(SAMPLE_RATE, NOISE, 1, alphas))
        steps = max(1, round(share / one_step))
        return {"kind": "subsampled_gaussian", "sample_rate": SAMPLE_RATE, "noise_multiplier": NOISE, "steps": steps}
    if family == "laplace":
        low, high = 1e-4, 20.0  # ε = 1 / scale; the share grows with ε
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (mid, high) if best_share(laplace_curve(1 / mid, alphas)) < share else (low, mid)
        return {"kind": "laplace", "scale": 1 / high}
    if family == "composed":
        return {"kind": "composed", "parts": [mechanism("gaussian", share / 2), mechanism("laplace", share / 2)]}
    raise ValueError(f"unknown mechanism family {family!r} (expected one of: {', '.join(FAMILIES)})")


def heterogeneous(
    *,
    seed: int = 0,
    duration: float = 300.0,
    rate: float = 20.0,
    initial_blocks: int = 10,
    block_interval: float = 10.0,
    timeout: float = 100.0,
    families: tuple[str, ...] = FAMILIES,
    batch: float | None = 10.0,
) -> Trace:
    """Blocks every ``block_interval`` s; pipelines of mixed mechanisms at ``rate`` per second."""
    rng = np.random.default_rng(seed)
    blocks = periodic_blocks(initial_blocks, block_interval, duration, BLOCK_EPSILON, BLOCK_DELTA)
    times = poisson_arrivals(rng, rate, duration)
    if batch:
        times = np.ceil(times / batch) * batch
    n = len(times)
    family = rng.integers(len(families), size=n)
    size = rng.integers(4, size=n)
    last = rng.choice(BLOCK_COUNTS, size=n, p=BLOCK_WEIGHTS)
    pipelines = [
        {
            "id": f"p{i}",
            "arrival": t,
            "blocks": {"last": int(last[i])},
            "mechanism": mechanism(families[family[i]], SIZES[families[family[i]]][size[i]]),
            "timeout": timeout,
            "class": families[family[i]],
        }
        for i, t in enumerate(times.tolist())
    ]
    return parse_trace({"accounting": "rdp", "blocks": blocks, "pipelines": pipelines})
