"""``privsched.simulate``: run a policy over a named workload or a trace."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from privsched.policies.base import PolicySpec
from privsched.simulation.engine import Simulator
from privsched.simulation.instance import Instance
from privsched.simulation.registry import generate_workload, workload_generators
from privsched.simulation.results import SimulationResult, used_share
from privsched.simulation.status import STATUS_NAMES

if TYPE_CHECKING:
    from privsched.simulation.generated import GeneratedTrace
    from privsched.simulation.trace import Trace


def resolve_policy(
    policy: str | PolicySpec,
    *,
    n: int | None = None,
    lifetime: float | None = None,
    k: int = 50,
    unlock: str | None = None,
) -> PolicySpec:
    """A :class:`PolicySpec` from a registry name and its parameters
    (:func:`privsched.policies.make_policy`, as ``serve`` does)."""
    if isinstance(policy, PolicySpec):
        return policy
    from privsched.policies import make_policy

    return make_policy(policy, n=n, lifetime=lifetime, k=k, unlock=unlock)


def load_workload(
    workload_or_trace: str | Path | Trace | GeneratedTrace | Instance,
    *,
    seed: int = 0,
    duration: float | None = None,
    **workload_params,
) -> tuple[str, Instance]:
    """A label and the compiled workload: a generated workload by name, or a trace (path or object).

    ``duration`` is the arrival window: generators produce arrivals within it, and a trace
    keeps only the blocks and pipelines that arrive before it.
    """
    if isinstance(workload_or_trace, Instance):
        label, instance = "instance", workload_or_trace
    elif not isinstance(workload_or_trace, (str, Path)):
        label, instance = "trace", workload_or_trace.instance
    else:
        name = str(workload_or_trace)
        generators = workload_generators()
        if name in generators:
            params = dict(workload_params)
            if duration is not None:
                params["duration"] = duration
            return name, generate_workload(generators, name, seed, params).instance
        if workload_params:
            raise ValueError(f"workload parameters {sorted(workload_params)} apply to generated workloads only")
        path = Path(name)
        if not path.exists() and not name.endswith(".json"):
            known = ", ".join(generators)
            raise ValueError(f"unknown workload {name!r}: not a trace file nor one of: {known}")
        from privsched.simulation.trace import load_trace

        label, instance = path.stem, load_trace(path).instance
    if duration is not None:
        instance = instance.until(duration)
    return label, instance


#: Most per-time unlock ticks a simulation may need.
MAX_SIMULATION_TICKS = 10**7


def check_tick(instance: Instance, spec: PolicySpec, tick: float | None) -> None:
    """Refuse a per-time tick that would take more than ``MAX_SIMULATION_TICKS`` ticks.

    Ticks matter only while some block is still locked: each block for one data lifetime
    L after its arrival, so a run needs at most min(span / tick, B · (L / tick + 1)) ticks,
    with span the time from the first block's arrival to the last one's plus L."""
    rate = spec.unlock.on_tick(1.0)
    if tick is None or rate <= 0 or instance.n_blocks == 0:
        return
    if not (isinstance(tick, (int, float)) and math.isfinite(tick) and tick > 0):
        raise ValueError(f"tick must be a positive number of seconds, got {tick!r}")
    lifetime = 1.0 / rate
    span = float(instance.block_arrival[-1] - instance.block_arrival[0]) + lifetime
    ticks = min(span / tick, instance.n_blocks * (lifetime / tick + 1))
    if ticks > MAX_SIMULATION_TICKS:
        raise ValueError(
            f"tick {tick:g} s would take about {ticks:.3g} unlock ticks, more than the limit of {MAX_SIMULATION_TICKS}: use a longer tick"
        )


def run(
    label: str,
    instance: Instance,
    spec: PolicySpec,
    *,
    tick: float | None = None,
    samples: int = 100,
    shortcuts: bool = True,
) -> SimulationResult:
    """Simulate ``spec`` over a compiled workload."""
    check_tick(instance, spec, tick)
    started, cpu = time.perf_counter(), time.process_time()
    state = Simulator(instance, spec, tick=tick, samples=samples, shortcuts=shortcuts).run()
    runtime, cpu = time.perf_counter() - started, time.process_time() - cpu
    acc = instance.accounting
    return SimulationResult(
        workload=label,
        policy=spec.name,
        params=dict(spec.params),
        accounting=acc.name,
        pipeline_ids=[str(i) for i in instance.pipeline_ids],
        arrival=instance.arrival.copy(),
        status=[STATUS_NAMES[s] for s in state.status],
        grant_time=state.grant_time.copy(),
        klass=[str(c) for c in instance.klass],
        block_ids=[str(b) for b in instance.block_ids],
        block_used=used_share(state.consumed, instance.capacity, acc),
        sample_times=state.sample_times,
        sample_used=used_share(state.sample_consumed, instance.capacity[None], acc),
        block_wasted=used_share(state.wasted, instance.capacity, acc) if np.any(state.wasted) else np.zeros(instance.n_blocks),
        passes=state.passes,
        runtime_s=runtime,
        cpu_s=cpu,
        fraction=state.fraction.copy() if instance.is_elastic else None,
    )


def simulate(
    workload_or_trace: str | Path | Trace | GeneratedTrace | Instance,
    policy: str | PolicySpec = "dpf-n",
    *,
    n: int | None = None,
    lifetime: float | None = None,
    seed: int = 0,
    duration: float | None = None,
    unlock: str | None = None,
    k: int = 50,
    tick: float | None = None,
    elastic: float | None = None,
    **workload_params,
) -> SimulationResult:
    """Simulate a scheduling policy over a workload (docs/design.md §4, §5).

    ``workload_or_trace`` is a registered workload name (:mod:`.registry`), a trace file, or a
    :class:`Trace`. ``policy`` is a name from ``privsched.policies.POLICY_NAMES`` with ``n`` / ``lifetime`` / ``unlock`` / ``k``, or a ready
    :class:`PolicySpec`. ``seed`` and ``**workload_params`` go to the workload generator;
    ``duration`` is the arrival window; ``tick`` the per-time unlock period (default
    lifetime/100). ``elastic`` m makes every pipeline ask for the range [m·ε, ε] (a workload
    parameter: generators that take it, such as the macrobenchmark's; docs/design.md §4.2).
    """
    if elastic is not None:
        workload_params["elastic"] = elastic
    spec = resolve_policy(policy, n=n, lifetime=lifetime, k=k, unlock=unlock)
    label, instance = load_workload(workload_or_trace, seed=seed, duration=duration, **workload_params)
    return run(label, instance, spec, tick=tick)
