"""Snapshots for policy tests: a builder, a hypothesis strategy, and the naive admission
walk and spending check the vectorised code is compared with."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from privsched.budgets.accounting import Accounting
from privsched.policies.base import Snapshot


def naive_admit(snapshot: Snapshot, order: np.ndarray) -> np.ndarray:
    """Reference: one pipeline at a time, test every block, subtract, move on."""
    accounting = snapshot.accounting
    available = np.array(snapshot.unlocked, dtype=float)
    live = accounting.live(snapshot.capacity)
    count = np.bincount(snapshot.edge_pipeline, minlength=snapshot.n_pipelines)
    start = np.cumsum(count) - count
    granted = []
    for p in order:
        edges = range(start[p], start[p] + count[p])
        blocks = [snapshot.edge_block[e] for e in edges]
        if all(accounting.fits(snapshot.edge_demand[e], available[b], live[b]) for e, b in zip(edges, blocks)):
            for e, b in zip(edges, blocks):
                available[b] = available[b] - snapshot.edge_demand[e]
            granted.append(p)
    return np.array(granted, dtype=np.intp)


def make_snapshot(
    demands: list[dict[int, float | list[float]]],
    unlocked: list,
    capacity: list | None = None,
    accounting: Accounting | None = None,
    arrival: list[float] | None = None,
    ids: list[str] | None = None,
    weight: list[float] | None = None,
) -> Snapshot:
    """A snapshot from plain lists: ``demands[i]`` maps block → demand (an ε under basic
    accounting, with δ = 0; a vector over the orders under RDP)."""
    accounting = accounting or Accounting.basic()

    def vector(value) -> list[float]:
        return [float(value), 0.0] if np.isscalar(value) and not accounting.is_rdp else list(value)

    unlocked_array = np.array([vector(u) for u in unlocked], dtype=float)
    rows = [(i, b, vector(d)) for i, wants in enumerate(demands) for b, d in sorted(wants.items())]
    n = len(demands)
    dims = accounting.dims
    return Snapshot(
        accounting=accounting,
        capacity=np.array([vector(c) for c in capacity], dtype=float) if capacity else unlocked_array.copy(),
        unlocked=unlocked_array,
        pipeline_ids=np.array(ids or [f"p{i}" for i in range(n)]),
        arrival=np.array(arrival if arrival is not None else range(n), dtype=float),
        weight=np.array(weight if weight is not None else [1.0] * n, dtype=float),
        edge_pipeline=np.array([r[0] for r in rows], dtype=np.intp),
        edge_block=np.array([r[1] for r in rows], dtype=np.intp),
        edge_demand=np.array([r[2] for r in rows], dtype=float).reshape(len(rows), dims),
    )


def spends_within(snapshot: Snapshot, granted: np.ndarray) -> bool:
    """Whether granting ``granted`` in order keeps every block within its unlocked budget:
    after each grant, every block's total holds in every dimension (basic) or at some live
    order (RDP), which is what sequential fitting guarantees."""
    live = snapshot.accounting.live(snapshot.capacity)
    total = np.zeros_like(snapshot.unlocked)
    for p in granted:
        edges = np.flatnonzero(snapshot.edge_pipeline == p)
        np.add.at(total, snapshot.edge_block[edges], snapshot.edge_demand[edges])
        touched = np.unique(snapshot.edge_block[edges])
        if not np.all(snapshot.accounting.fits(total[touched], snapshot.unlocked[touched], live[touched])):
            return False
    return True


# Demands and budgets are multiples of 1/4 so that every sum is exact in floating point.
quarters = st.integers(min_value=0, max_value=8).map(lambda q: q / 4)


@st.composite
def snapshots(draw, rdp: bool | None = None) -> Snapshot:
    """Random small snapshots, basic or RDP (3 orders, some dead on some blocks)."""
    if rdp is None:
        rdp = draw(st.booleans())
    accounting = Accounting.rdp((2.0, 4.0, 8.0)) if rdp else Accounting.basic()
    dims = accounting.dims
    n_blocks = draw(st.integers(1, 4))
    n_pipelines = draw(st.integers(0, 12))
    capacity = [[draw(quarters) for _ in range(dims)] for _ in range(n_blocks)]
    unlocked = [[draw(st.integers(0, 4)) / 4 * c for c in row] for row in capacity]
    demands = []
    for _ in range(n_pipelines):
        blocks = draw(st.sets(st.integers(0, n_blocks - 1), min_size=0, max_size=n_blocks))
        demands.append({b: [draw(quarters) for _ in range(dims)] for b in blocks})
    arrival = [draw(st.integers(0, 3)) for _ in range(n_pipelines)]
    return make_snapshot(demands, unlocked, capacity, accounting, arrival=arrival)
