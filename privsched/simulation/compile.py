"""Compiling a validated trace into an :class:`~privsched.simulation.instance.Instance`:
cross-references resolved, demands turned into vectors, entries sorted by arrival."""

from __future__ import annotations

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.capacity import block_capacity
from privsched.budgets.mechanisms import Explicit, Laplace, Mechanism, demand_vector, mechanism_json
from privsched.simulation.instance import Instance, plain_demand
from privsched.simulation.trace import LastBlocks, Trace, TraceError, TracePipeline


def _mechanism(p: TracePipeline) -> Mechanism | None:
    """A pipeline's demand as a mechanism description (trace format rules); None for a
    plain (ε, δ), charged :func:`~privsched.simulation.instance.plain_demand`."""
    if p.curve is not None:
        if p.mechanism is not None or p.epsilon is not None:
            raise ValueError("give either curve or epsilon/mechanism, not both")
        return Explicit(values=p.curve)
    if p.mechanism is not None and not isinstance(p.mechanism, str):
        return p.mechanism
    if p.epsilon is None:
        raise ValueError("has no demand (give epsilon, demands, curve or mechanism)")
    if p.mechanism == "laplace":
        return Laplace(scale=1.0 / p.epsilon)
    return None


class _Demands:
    """Demand vectors, computed once per distinct description."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting
        self.cache: dict[tuple, np.ndarray] = {}

    def of(self, p: TracePipeline) -> np.ndarray:
        """The demand vector of a pipeline's whole-pipeline description."""
        if p.curve is not None:
            key: tuple = ("curve", tuple(p.curve), p.epsilon, p.mechanism is None)
        elif p.mechanism is None or isinstance(p.mechanism, str):
            key = (p.mechanism, p.epsilon, p.delta)
        else:
            key = ("object", mechanism_json(p.mechanism))
        vector = self.cache.get(key)
        if vector is None:
            mechanism = _mechanism(p)
            if mechanism is None:
                assert p.epsilon is not None  # _mechanism refuses a pipeline without a demand
                vector = plain_demand(p.epsilon, p.delta, self.accounting)
            else:
                vector = demand_vector(mechanism, self.accounting)
            self.cache[key] = vector
        return vector

    def epsilon(self, epsilon: float, delta: float) -> np.ndarray:
        """The demand vector of a per-block (ε, δ) entry."""
        key = ("epsilon", epsilon, delta)
        vector = self.cache.get(key)
        if vector is None:
            vector = self.cache[key] = plain_demand(epsilon, delta, self.accounting)
        return vector


def _resolve_blocks(p: TracePipeline, index: dict[str, int], arrival: np.ndarray) -> list[int]:
    """Block indices a pipeline asks for; the blocks must exist when it arrives."""
    if isinstance(p.blocks, LastBlocks):
        existing = int(np.searchsorted(arrival, p.arrival, side="right"))
        if existing == 0:
            raise ValueError(f"arrives at {p.arrival:g} before any block exists")
        return list(range(max(0, existing - p.blocks.last), existing))
    blocks = []
    for key in p.blocks:
        j = index.get(key)
        if j is None:
            raise ValueError(f"asks for unknown block {key!r}")
        if arrival[j] > p.arrival:
            raise ValueError(f"arrives at {p.arrival:g}, before its block {key!r} (arrival {arrival[j]:g})")
        blocks.append(j)
    return blocks


def compile_trace(trace: Trace) -> Instance:
    """Check cross-references and demands, and build the simulator's arrays."""
    if trace.accounting == "rdp":
        try:
            accounting = Accounting.rdp(trace.alphas)
        except ValueError as exc:
            raise TraceError(f"invalid trace: alphas: {exc}") from None
    elif trace.alphas:
        raise TraceError("invalid trace: alphas: basic accounting takes no RDP orders")
    else:
        accounting = Accounting.basic()

    block_order = sorted(range(len(trace.blocks)), key=lambda i: trace.blocks[i].arrival)
    blocks = [trace.blocks[i] for i in block_order]
    ids = np.array([b.id for b in blocks], dtype=object)
    index: dict[str, int] = {}
    capacity = np.zeros((len(blocks), accounting.dims))
    for j, (i, b) in enumerate(zip(block_order, blocks)):
        if b.id in index:
            raise TraceError(f"invalid trace: blocks[{i}] {b.id!r}: duplicate block id")
        index[b.id] = j
        try:
            capacity[j] = block_capacity(accounting, b.epsilon, b.delta)
        except ValueError as exc:
            raise TraceError(f"invalid trace: blocks[{i}] {b.id!r}: {exc}") from None
    block_arrival = np.array([b.arrival for b in blocks], dtype=float)

    order = sorted(range(len(trace.pipelines)), key=lambda i: trace.pipelines[i].arrival)
    demands = _Demands(accounting)
    seen: set[str] = set()
    edge_block: list[int] = []
    edge_demand: list[np.ndarray] = []
    counts: list[int] = []
    for i in order:
        p = trace.pipelines[i]
        try:
            if p.id in seen:
                raise ValueError("duplicate pipeline id")
            seen.add(p.id)
            resolved = _resolve_blocks(p, index, block_arrival)
            per_block = p.demands or {}
            if per_block:
                if accounting.is_rdp:
                    raise ValueError("per-block demands are epsilons, for basic accounting only")
                unknown = set(per_block) - {ids[j] for j in resolved}
                if unknown:
                    raise ValueError(f"demands name blocks it does not ask for: {sorted(unknown)}")
            default = None if len(per_block) == len(resolved) else demands.of(p)
            for j in resolved:
                eps = per_block.get(ids[j])
                if eps is None:
                    assert default is not None  # some block has no demand of its own: the default is set
                    edge_demand.append(default)
                else:
                    edge_demand.append(demands.epsilon(eps, p.delta))
            edge_block.extend(resolved)
            counts.append(len(resolved))
        except ValueError as exc:
            raise TraceError(f"invalid trace: pipelines[{i}] {p.id!r}: {exc}") from None

    pipelines = [trace.pipelines[i] for i in order]
    teams = sorted(trace.quotas or {})
    team_index = {name: t for t, name in enumerate(teams)}
    return Instance(
        accounting=accounting,
        block_ids=ids,
        block_arrival=block_arrival,
        capacity=capacity,
        pipeline_ids=np.array([p.id for p in pipelines], dtype=object),
        arrival=np.array([p.arrival for p in pipelines], dtype=float),
        weight=np.array([p.weight for p in pipelines], dtype=float),
        timeout=np.array([np.inf if p.timeout is None else p.timeout for p in pipelines], dtype=float),
        klass=np.array([p.klass for p in pipelines], dtype=object),
        edge_start=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64),
        edge_block=np.array(edge_block, dtype=np.int64),
        edge_demand=np.array(edge_demand, dtype=float).reshape(len(edge_block), accounting.dims),
        team=np.array([team_index.get(p.team or "", -1) for p in pipelines], dtype=np.intp) if teams else None,
        share=np.array([(trace.quotas or {})[name] for name in teams], dtype=float) if teams else None,
    )
