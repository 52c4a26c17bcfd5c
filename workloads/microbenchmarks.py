"""The OSDI'21 microbenchmarks (Luo et al. §6.1; docs/design.md §5.1), seeded and deterministic.

Pipelines arrive as a Poisson process; 75 % are mice (ε = 0.01) and 25 % elephants
(ε = 0.1). Under basic accounting a pipeline demands (ε, δ = 1e-9); under RDP the Gaussian
mechanism calibrated to the same (ε, δ). Blocks hold ε_G = 1, δ_G = 1e-6.
- single block: one block at time 0, 1 pipeline/s for 236 s. Under RDP a block holds far
  more pipelines, so the rate is scaled by the multi-block workload's factor 234.4/12.8
  (18.3 pipelines/s) to keep the block contended;
- multi block: 11 blocks at time 0, then one every 10 s; 12.8 pipelines/s (RDP: 234.4/s)
  for 300 s; each pipeline asks for the last block (p = 0.75) or the last 10 (p = 0.25).
Every pipeline times out 300 s after it arrives.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np

from privsched.simulation.params import Between
from privsched.simulation.generated import GeneratedTrace

MICE_EPSILON = 0.01
ELEPHANT_EPSILON = 0.1
MICE_FRACTION = 0.75
PIPELINE_DELTA = 1e-9
BLOCK_EPSILON = 1.0
BLOCK_DELTA = 1e-6
TIMEOUT = 300.0
#: Most pipelines (expected arrivals) and blocks a generated workload may have.
MAX_PIPELINES = 10**6
MAX_BLOCKS = 100_000
#: Arrival rates (pipelines per second) under basic and RDP accounting.
SINGLE_RATE = {"basic": 1.0, "rdp": 1.0 * 234.4 / 12.8}
MULTI_RATE = {"basic": 12.8, "rdp": 234.4}


def poisson_arrivals(rng: np.random.Generator, rate: float, duration: float) -> np.ndarray:
    """Sorted arrival times of a Poisson process of ``rate`` per second on (0, duration)."""
    if not rate > 0 or not duration > 0:
        raise ValueError(f"rate and duration must be positive, got {rate!r} and {duration!r}")
    if rate * duration > MAX_PIPELINES:
        raise ValueError(
            f"rate {rate:g}/s over {duration:g} s means about {rate * duration:.3g} pipelines, more than the limit of {MAX_PIPELINES}"
        )
    return np.sort(rng.uniform(0.0, duration, rng.poisson(rate * duration)))


def periodic_blocks(initial: int, interval: float, duration: float, epsilon: float, delta: float) -> list[dict]:
    """``initial`` blocks at time 0, then one every ``interval`` seconds before ``duration``."""
    return [
        {"id": f"b{j}", "arrival": t, "epsilon": epsilon, "delta": delta}
        for j, t in enumerate(block_times(initial, interval, duration).tolist())
    ]


def block_times(initial: int, interval: float, duration: float) -> np.ndarray:
    """Arrival times of ``initial`` blocks at time 0, then one every ``interval`` seconds before ``duration``."""
    if not interval > 0:
        raise ValueError(f"the block interval must be positive, got {interval!r}")
    count = initial + max(0.0, duration / interval)
    if count > MAX_BLOCKS:
        raise ValueError(f"the workload would have about {count:.3g} blocks, more than the limit of {MAX_BLOCKS}")
    return np.concatenate([np.zeros(initial), np.arange(interval, duration, interval)])


def _workload(
    accounting: str, rng: np.random.Generator, blocks: np.ndarray, times: np.ndarray, last: np.ndarray, timeout: float
) -> GeneratedTrace:
    """Blocks of (ε_G, δ_G) arriving at ``blocks``; pipelines at ``times``, each a mouse or
    an elephant (drawn from ``rng``) asking for its ``last`` blocks."""
    elephant = (rng.random(len(times)) >= MICE_FRACTION).astype(np.intp)
    return GeneratedTrace(
        accounting=accounting,
        block_ids=[f"b{j}" for j in range(len(blocks))],
        block_arrival=blocks,
        block_epsilon=np.full(len(blocks), BLOCK_EPSILON),
        block_delta=np.full(len(blocks), BLOCK_DELTA),
        pipeline_ids=[f"p{i}" for i in range(len(times))],
        arrival=times,
        last=last,
        demand=elephant,
        demands=({"epsilon": MICE_EPSILON, "delta": PIPELINE_DELTA}, {"epsilon": ELEPHANT_EPSILON, "delta": PIPELINE_DELTA}),
        timeout=np.full(len(times), float(timeout)),
        klass=elephant,
        classes=("mice", "elephants"),
    )


def single_block(
    *,
    accounting: str = "basic",
    seed: int = 0,
    duration: float = 236.0,
    rate: float | None = None,
    timeout: float = TIMEOUT,
) -> GeneratedTrace:
    """One static block; mice and elephants arriving at ``rate`` per second for ``duration`` s."""
    rate = SINGLE_RATE.get(accounting, 1.0) if rate is None else rate
    rng = np.random.default_rng(seed)
    times = poisson_arrivals(rng, rate, duration)
    return _workload(accounting, rng, np.zeros(1), times, np.ones(len(times), dtype=np.int64), timeout)


def multi_block(
    *,
    accounting: str = "basic",
    seed: int = 0,
    duration: float = 300.0,
    rate: float | None = None,
    initial_blocks: Annotated[int, Between(0, MAX_BLOCKS)] = 11,
    block_interval: float = 10.0,
    many: Annotated[int, Between(1, MAX_BLOCKS)] = 10,
    p_one: Annotated[float, Between(0, 1)] = 0.75,
    timeout: float = TIMEOUT,
) -> GeneratedTrace:
    """Blocks arriving every ``block_interval`` s; each pipeline wants the last 1 or ``many`` blocks."""
    rate = MULTI_RATE.get(accounting, 12.8) if rate is None else rate
    rng = np.random.default_rng(seed)
    blocks = block_times(initial_blocks, block_interval, duration)
    times = poisson_arrivals(rng, rate, duration)
    last = np.where(rng.random(len(times)) < p_one, 1, many)
    return _workload(accounting, rng, blocks, times, last, timeout)
