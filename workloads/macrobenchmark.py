"""An Amazon-Reviews-like macrobenchmark (Luo et al., OSDI'21 §6.2; docs/design.md §5.2).

One block per day (ε_G = 10, δ_G = 1e-7); pipelines arrive as a Poisson process,
300 per day for 50 days by default (``days`` and ``pipelines_per_day`` scale it down), and
time out after 5 block periods.
- 75 % mice: DP statistics, Laplace with ε ∈ {0.01, 0.05, 0.1}. A statistic's error
  shrinks like 1/(ε n), so it takes the fewest blocks reaching its target accuracy:
  ``ceil(target / ε)`` blocks with ``target`` ∈ {0.02, 0.05, 0.1} (1 to 10 blocks; total
  demand ε × blocks ≤ 0.1, what the paper saw basic composition still grant).
- 25 % elephants: DP-SGD models (linear, feed-forward, LSTM, small BERT), (ε, δ = 1e-9)
  with ε ∈ {0.5, 1, 5}; bigger models need more data, and more at smaller ε:
  ``ceil(base / ε)`` blocks, base 1, 2, 5, 50 (1 to 100 blocks, at most 500). Under RDP a
  model's demand is the subsampled Gaussian of its training plan, its noise calibrated
  under RDP to (ε, δ) as a DP-SGD job's plan is (docs/design.md §3.4).
Time is in seconds; a block period is one day by default.
"""

from __future__ import annotations

import math
from typing import Annotated

import numpy as np

from privsched.simulation.params import Between
from privsched.simulation.trace import Trace, parse_trace
from privsched.trainers.plans import calibrate_noise
from workloads.microbenchmarks import MAX_BLOCKS as MAX_WORKLOAD_BLOCKS
from workloads.microbenchmarks import MAX_PIPELINES
from workloads.microbenchmarks import poisson_arrivals

DAY = 86_400.0
BLOCK_EPSILON, BLOCK_DELTA = 10.0, 1e-7
MICE_EPSILONS = (0.01, 0.05, 0.1)
MICE_TARGETS = (0.02, 0.05, 0.1)
ELEPHANT_EPSILONS = (0.5, 1.0, 5.0)
ELEPHANT_DELTA = 1e-9
MAX_BLOCKS = 500

#: DP-SGD plans: (model, blocks needed at ε = 1, Poisson sampling rate, epochs).
MODELS = (
    ("linear", 1, 0.01, 5),
    ("feedforward", 2, 0.01, 10),
    ("lstm", 5, 0.005, 10),
    ("bert", 50, 0.002, 3),
)


def blocks_needed(base: float, epsilon: float) -> int:
    """``ceil(base / ε)``, immune to float noise such as 0.05 / 0.01 = 5.000000000000001."""
    return min(MAX_BLOCKS, math.ceil(round(base / epsilon, 9)))


def _elephant(rng: np.random.Generator, accounting: str) -> tuple[dict, int]:
    _, base, sample_rate, epochs = MODELS[rng.integers(len(MODELS))]
    epsilon = float(ELEPHANT_EPSILONS[rng.integers(len(ELEPHANT_EPSILONS))])
    blocks = blocks_needed(base, epsilon)
    if accounting == "rdp":
        steps = round(epochs / sample_rate)
        noise = calibrate_noise(sample_rate, steps, epsilon, ELEPHANT_DELTA)
        demand = {"mechanism": {"kind": "subsampled_gaussian", "sample_rate": sample_rate,
                                "noise_multiplier": noise, "steps": steps}}
    else:
        demand = {"epsilon": epsilon, "delta": ELEPHANT_DELTA}
    return demand, blocks


def macrobenchmark(
    *,
    accounting: str = "rdp",
    seed: int = 0,
    days: Annotated[int, Between(1, MAX_WORKLOAD_BLOCKS)] = 50,
    pipelines_per_day: Annotated[float, Between(0, MAX_PIPELINES)] = 300.0,
    block_period: float = DAY,
    timeout_periods: float = 5.0,
    duration: float | None = None,
) -> Trace:
    """Daily blocks and a mix of DP statistics (mice) and DP-SGD models (elephants)."""
    if not block_period > 0:
        raise ValueError(f"block_period must be positive, got {block_period!r}")
    if duration is not None:
        periods = duration / block_period  # may overflow to inf: compared before it is rounded
        days = max(1, math.ceil(periods)) if periods <= MAX_WORKLOAD_BLOCKS else MAX_WORKLOAD_BLOCKS + 1
    if days > MAX_WORKLOAD_BLOCKS:
        raise ValueError(f"the workload would have {days} daily blocks, more than the limit of {MAX_WORKLOAD_BLOCKS}")
    rng = np.random.default_rng(seed)
    blocks = [
        {"id": f"day{d}", "arrival": d * block_period, "epsilon": BLOCK_EPSILON, "delta": BLOCK_DELTA}
        for d in range(days)
    ]
    horizon = days * block_period if duration is None else duration
    times = poisson_arrivals(rng, pipelines_per_day / block_period, horizon)
    pipelines = []
    for i, t in enumerate(times.tolist()):
        if rng.random() < 0.75:
            epsilon = float(MICE_EPSILONS[rng.integers(len(MICE_EPSILONS))])
            target = MICE_TARGETS[rng.integers(len(MICE_TARGETS))]
            demand, n_blocks, klass = {"epsilon": epsilon, "mechanism": "laplace"}, blocks_needed(target, epsilon), "mice"
        else:
            (demand, n_blocks), klass = _elephant(rng, accounting), "elephants"
        pipelines.append(
            {"id": f"p{i}", "arrival": t, "blocks": {"last": n_blocks}, **demand,
             "timeout": timeout_periods * block_period, "class": klass}
        )
    return parse_trace({"accounting": accounting, "blocks": blocks, "pipelines": pipelines})
