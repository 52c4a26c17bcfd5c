"""A generated workload held as columns and compiled in bulk (docs/design.md §5).

A workload generator knows the shape of what it makes: every pipeline asks for the last k
blocks existing at its arrival (or for a list of blocks, given as index arrays), and its
demand is one of a few descriptions or a row of a table of explicit curves. Validating
each of tens of thousands of entries as a trace document would cost more than simulating
them, so a :class:`GeneratedTrace` keeps the columns, checks them as whole NumPy arrays
and builds the simulator's :class:`~privsched.simulation.instance.Instance` directly, with
each distinct demand and block budget computed once. The arrays are those
:func:`~privsched.simulation.compile.compile_trace` gives the same workload written as a
trace and validated entry by entry (tests/test_sim_generated.py); that document, for
``privsched trace`` or inspection, is built and validated only when asked for
(:attr:`GeneratedTrace.trace`). Simulating a generated workload imports no pydantic
unless one of its demands is a mechanism description.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_DEMAND, MAX_EPSILON, MIN_EPSILON, check_delta, check_number
from privsched.budgets.capacity import block_capacity
from privsched.budgets.elastic import minimum_fraction
from privsched.simulation.described import described_vector
from privsched.simulation.instance import Instance, plain_demand
from privsched.simulation.limits import MAX_TIME, TraceError
from privsched.text import printable

if TYPE_CHECKING:
    from privsched.simulation.trace import Trace, TraceBlock, TracePipeline


@dataclass(frozen=True, eq=False)
class GeneratedTrace:
    """A generated workload: blocks, and pipelines each asking for its ``last`` k blocks or,
    when ``block_lists`` is given instead, for its own list of blocks: pipeline i's are
    ``block_lists[1][block_lists[0][i]:block_lists[0][i + 1]]``, indices into ``block_ids``.

    ``demand`` and ``klass`` index ``demands`` (each ``{"epsilon": ε, "delta": δ}``, a plain
    (ε, δ), or ``{"mechanism": {...}}``, a mechanism description, as in a trace) and
    ``classes``; a ``demand`` of ``len(demands) + r`` is row r of ``curves``, an explicit
    demand curve (a trace's ``curve``). An infinite ``timeout`` is none. Arrays are per block
    or per pipeline, in any order (compiled stably by arrival, as a trace is)."""

    accounting: str  # "basic" or "rdp"
    block_ids: list[str]
    block_arrival: np.ndarray  # seconds
    block_epsilon: np.ndarray  # ε_G
    block_delta: np.ndarray  # δ_G
    pipeline_ids: list[str]
    arrival: np.ndarray  # seconds
    last: np.ndarray | None  # k: the pipeline asks for the last k blocks existing at its arrival
    demand: np.ndarray  # index into ``demands``
    demands: tuple[dict[str, Any], ...]
    timeout: np.ndarray  # seconds
    klass: np.ndarray  # index into ``classes``
    classes: tuple[str, ...]
    curves: np.ndarray | None = None  # (C, K) explicit demand curves
    block_lists: tuple[np.ndarray, np.ndarray] | None = None  # (P + 1,) offsets, (E,) block indices
    #: Elastic demands (docs/design.md §4.2): for each of ``demands``, the description of the
    #: smallest demand its pipelines accept (the mechanism calibrated to the smallest ε of
    #: the range); None when every demand is fixed. Explicit ``curves`` stay fixed.
    minimums: tuple[dict[str, Any], ...] | None = None

    @cached_property
    def instance(self) -> Instance:
        """The compiled arrays the simulator runs on (computed once)."""
        return _compile(self)

    def document(self) -> dict:
        """The workload as a trace document (the format of :mod:`privsched.simulation.trace`).
        A trace holds fixed demands only: a workload with elastic ones is refused (ValueError)."""
        if self.minimums is not None:
            raise ValueError("a trace holds fixed demands only: simulate elastic demands from the workload itself")
        blocks = [
            {"id": i, "arrival": t, "epsilon": e, "delta": d}
            for i, t, e, d in zip(self.block_ids, self.block_arrival.tolist(), self.block_epsilon.tolist(), self.block_delta.tolist())
        ]
        if self.block_lists is None:
            assert self.last is not None, "a generated workload gives last or block_lists"
            asked: list = [{"last": k} for k in self.last.tolist()]
        else:
            start, index = (np.asarray(a).tolist() for a in self.block_lists)
            asked = [[self.block_ids[j] for j in index[start[i] : start[i + 1]]] for i in range(len(self.pipeline_ids))]
        curves = [] if self.curves is None else [{"curve": row} for row in np.asarray(self.curves, dtype=float).tolist()]
        described = [*self.demands, *curves]
        pipelines = [
            {
                "id": i,
                "arrival": t,
                "blocks": blocks,
                **described[d],
                **({} if math.isinf(timeout) else {"timeout": timeout}),
                "class": self.classes[c],
            }
            for i, t, blocks, d, timeout, c in zip(
                self.pipeline_ids,
                self.arrival.tolist(),
                asked,
                self.demand.tolist(),
                self.timeout.tolist(),
                self.klass.tolist(),
            )
        ]
        return {"accounting": self.accounting, "blocks": blocks, "pipelines": pipelines}

    @cached_property
    def trace(self) -> Trace:
        """The workload as a validated trace (:func:`~privsched.simulation.trace.parse_trace`)."""
        from privsched.simulation.trace import parse_trace

        return parse_trace(self.document())

    @property
    def blocks(self) -> list[TraceBlock]:
        return self.trace.blocks

    @property
    def pipelines(self) -> list[TracePipeline]:
        return self.trace.pipelines

    def to_dict(self) -> dict:
        """The validated trace document, as :meth:`Trace.to_dict` writes it."""
        return self.trace.to_dict()


def _problem(kind: str, ids: list[str], bad: np.ndarray, problem: str) -> TraceError:
    """The error naming the first entry flagged in ``bad``, as a trace's errors do."""
    i = int(np.argmax(bad))
    return TraceError(f"invalid trace: {kind}[{i}] {ids[i]!r}: {problem}")


def _refuse(kind: str, ids: list[str], bad: np.ndarray, problem: str) -> None:
    """Raise :func:`_problem` if any entry is flagged in ``bad``."""
    if bad.any():
        raise _problem(kind, ids, bad, problem)


def _times(kind: str, ids: list[str], values: np.ndarray, what: str, low: float) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    _refuse(kind, ids, ~((values >= low) & (values <= MAX_TIME)), f"{what} must be in [{low:g}, {MAX_TIME:g}]")
    return values


def _distinct(kind: str, ids: list[str]) -> None:
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        first = next(i for i, key in enumerate(ids) if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise TraceError(f"invalid trace: {kind}[{first}] {ids[first]!r}: duplicate {kind[:-1]} id")


def _curve_table(curves: np.ndarray | None, accounting: Accounting) -> tuple[np.ndarray, np.ndarray]:
    """Explicit demand curves, each checked as
    :func:`~privsched.budgets.mechanisms.demand_vector` checks an ``Explicit`` demand, and the
    rows that fail (all at once)."""
    if curves is None:
        return np.zeros((0, accounting.dims)), np.zeros(0, dtype=bool)
    table = np.asarray(curves, dtype=float)
    if table.ndim != 2 or table.shape[1] != accounting.dims:
        raise TraceError(f"invalid trace: explicit demand has {table.shape[-1]} values, the dataset's budgets have {accounting.dims}")
    with np.errstate(invalid="ignore"):
        bad = ~np.all(np.isfinite(table) & (table >= 0) & (table <= MAX_DEMAND), axis=1)
    return table, bad


def _block_lists(w: GeneratedTrace, rank: np.ndarray, block_arrival: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each pipeline's listed blocks (positions among blocks sorted by arrival), in the order
    listed, and the offsets of its edges, checked as a trace's lists are: non-empty, no block
    twice, every block existing and arrived by the pipeline's arrival."""
    assert w.block_lists is not None
    start, index = (np.asarray(a, dtype=np.int64) for a in w.block_lists)
    n_pipelines = len(w.pipeline_ids)
    if start.shape != (n_pipelines + 1,) or start[0] != 0 or np.any(np.diff(start) < 0) or start[-1] != len(index):
        raise TraceError("invalid trace: block lists must be offsets 0 <= ... <= their number of indices, one per pipeline")
    counts = np.diff(start)
    _refuse("pipelines", w.pipeline_ids, counts < 1, "asks for no block")
    owner = np.repeat(np.arange(n_pipelines), counts)
    unknown = np.bincount(owner[(index < 0) | (index >= len(w.block_ids))], minlength=n_pipelines) > 0
    _refuse("pipelines", w.pipeline_ids, unknown, "asks for an unknown block")
    position = rank[index]
    pairs = np.sort(owner * len(w.block_ids) + position)
    twice = np.zeros(n_pipelines, dtype=bool)
    twice[pairs[1:][pairs[1:] == pairs[:-1]] // max(len(w.block_ids), 1)] = True
    _refuse("pipelines", w.pipeline_ids, twice, "lists a block twice")
    early = np.zeros(n_pipelines, dtype=bool)
    early[owner[block_arrival[position] > np.asarray(w.arrival, dtype=float)[owner]]] = True
    _refuse("pipelines", w.pipeline_ids, early, "arrives before one of its blocks")
    counts = counts[order]
    edge_start = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
    taken = np.repeat(start[:-1][order], counts) + np.arange(int(edge_start[-1])) - np.repeat(edge_start[:-1], counts)
    return edge_start, position[taken].astype(np.int64)


@lru_cache(maxsize=4096)
def mechanism_demand(description: str, accounting: Accounting) -> np.ndarray:
    """The demand vector :func:`~privsched.budgets.mechanisms.demand_vector` gives the
    mechanism described by ``description`` (its JSON text), read-only: computed once per
    process, as it is a deterministic function of public parameters. A plainly valid
    description is read without the models (:mod:`privsched.simulation.described`, the same
    checks and vector); any other is parsed by them."""
    vector = described_vector(description, accounting)
    if vector is None:
        from privsched.budgets.mechanisms import demand_vector, parse_mechanism

        vector = demand_vector(parse_mechanism(description), accounting)
    vector.setflags(write=False)
    return vector


def _demand_vector(description: dict[str, Any], accounting: Accounting) -> np.ndarray:
    """A pipeline demand's vector: a plain (ε, δ) or a mechanism description."""
    if set(description) == {"mechanism"}:
        return mechanism_demand(json.dumps(description["mechanism"], sort_keys=True), accounting)
    if set(description) != {"epsilon", "delta"}:
        raise ValueError(f"a generated demand is a plain epsilon and delta or a mechanism, not {sorted(description)}")
    epsilon = check_number(description["epsilon"], "epsilon", MIN_EPSILON, MAX_EPSILON)
    return plain_demand(epsilon, check_delta(description["delta"], "delta"), accounting)


def covering_fraction(maximum: np.ndarray, minimum: np.ndarray, live: np.ndarray) -> float:
    """The smallest f in (0, 1] with ``f × maximum ≥ minimum`` at every live dimension: the
    fraction of a pipeline's maximum demand that still covers the demand of its mechanism
    calibrated to the smallest ε of its range, as the live scheduler computes it
    (:func:`privsched.budgets.elastic.minimum_fraction`). Charging a curve at least the
    mechanism's own at every order is sound (RDP composes by adding curves, and a mechanism
    ε(α)-RDP is ε'(α)-RDP for every ε' ≥ ε: Mironov 2017, Def. 4, Prop. 1); under basic
    accounting the same holds for (ε, δ) (Dwork & Roth 2014, Thm 3.16). 1 when the minimum
    asks for more than the maximum somewhere."""
    try:
        return minimum_fraction(minimum, maximum, np.asarray(live, dtype=bool))
    except ValueError:
        return 1.0


def _compile(w: GeneratedTrace) -> Instance:
    """The instance of a generated workload, checked in bulk; the arrays are built as
    :func:`~privsched.simulation.compile.compile_trace` builds them, entry for entry."""
    if w.accounting not in ("basic", "rdp"):
        raise TraceError(f"invalid trace: accounting must be 'basic' or 'rdp', got {w.accounting!r}")
    accounting = Accounting.rdp(None) if w.accounting == "rdp" else Accounting.basic()
    n_pipelines = len(w.pipeline_ids)
    _distinct("blocks", w.block_ids)
    _distinct("pipelines", w.pipeline_ids)

    block_order = np.argsort(_times("blocks", w.block_ids, w.block_arrival, "arrival", -MAX_TIME), kind="stable")
    block_arrival = np.asarray(w.block_arrival, dtype=float)[block_order]
    budgets = np.stack([np.asarray(w.block_epsilon, dtype=float), np.asarray(w.block_delta, dtype=float)], axis=1)
    distinct, which = np.unique(budgets, axis=0, return_inverse=True)
    rows = []
    for d, (epsilon, delta) in enumerate(distinct.tolist()):
        try:
            rows.append(block_capacity(accounting, epsilon, delta))
        except ValueError as exc:
            raise _problem("blocks", w.block_ids, which.reshape(-1) == d, str(exc)) from None
    capacity = np.array(rows, dtype=float).reshape(len(distinct), accounting.dims)[which.reshape(-1)][block_order]

    arrival = _times("pipelines", w.pipeline_ids, w.arrival, "arrival", -MAX_TIME)
    timeout = np.asarray(w.timeout, dtype=float)
    none = timeout == math.inf
    _times("pipelines", w.pipeline_ids, np.where(none, MAX_TIME, timeout), "timeout", math.ulp(0.0))
    demand, klass = np.asarray(w.demand, dtype=np.intp), np.asarray(w.klass, dtype=np.intp)
    table, bad_curve = _curve_table(w.curves, accounting)
    for index, n_choices in ((demand, len(w.demands) + len(table)), (klass, len(w.classes))):
        _refuse("pipelines", w.pipeline_ids, (index < 0) | (index >= n_choices), "names no generated demand or class")
    explicit = demand - len(w.demands)
    bad = np.append(bad_curve, False)[np.where(explicit >= 0, explicit, -1)]  # index -1: not an explicit curve
    _refuse("pipelines", w.pipeline_ids, bad, f"explicit demand values must be in [0, {MAX_DEMAND:g}]")
    for name in w.classes:
        if printable(name) != name or len(name) > 256:
            raise TraceError(f"invalid trace: class {name!r} is not a printable name of at most 256 characters")
    vectors = np.zeros((len(w.demands), accounting.dims))
    for d, description in enumerate(w.demands):
        try:
            vectors[d] = _demand_vector(description, accounting)
        except ValueError as exc:
            raise _problem("pipelines", w.pipeline_ids, demand == d, str(exc)) from None

    low = _minimum_fractions(w, vectors, accounting)
    vectors = np.concatenate([vectors, table])
    order = np.argsort(arrival, kind="stable")
    if w.block_lists is not None:
        rank = np.empty(len(block_order), dtype=np.int64)
        rank[block_order] = np.arange(len(block_order))
        edge_start, edge_block = _block_lists(w, rank, block_arrival, order)
    else:
        assert w.last is not None, "a generated workload gives last or block_lists"
        last = np.asarray(w.last, dtype=np.int64)
        _refuse("pipelines", w.pipeline_ids, last < 1, "asks for no block")
        existing = np.searchsorted(block_arrival, arrival[order], side="right")
        if n_pipelines and not existing.all():
            i = int(order[np.argmin(existing)])
            raise TraceError(f"invalid trace: pipelines[{i}] {w.pipeline_ids[i]!r}: arrives at {w.arrival[i]:g} before any block exists")
        counts = np.minimum(last[order], existing)
        edge_start = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        first = np.repeat(existing - counts - edge_start[:-1], counts)
        edge_block = (first + np.arange(int(edge_start[-1]))).astype(np.int64)
    owner = np.repeat(np.arange(n_pipelines), np.diff(edge_start))
    arrival = arrival[order]
    return Instance(
        accounting=accounting,
        block_ids=np.array(w.block_ids, dtype=object)[block_order],
        block_arrival=block_arrival,
        capacity=capacity,
        pipeline_ids=np.array(w.pipeline_ids, dtype=object)[order],
        arrival=arrival,
        weight=np.ones(n_pipelines),
        timeout=timeout[order],
        klass=np.array(w.classes, dtype=object)[klass[order]],
        edge_start=edge_start,
        edge_block=edge_block,
        edge_demand=vectors[demand[order]][owner].reshape(len(owner), accounting.dims),
        elastic_min=None if low is None else np.concatenate([low, np.ones(len(table))])[demand[order]],
    )


def _minimum_fractions(w: GeneratedTrace, vectors: np.ndarray, accounting: Accounting) -> np.ndarray | None:
    """Under elastic demands, each described demand's :func:`covering_fraction` of its
    minimum; None when every demand is fixed."""
    if w.minimums is None:
        return None
    if len(w.minimums) != len(w.demands):
        raise TraceError("invalid trace: elastic demands need one minimum per generated demand")
    live = np.ones(accounting.dims, dtype=bool)
    low = np.ones(len(w.demands))
    for d, description in enumerate(w.minimums):
        try:
            low[d] = covering_fraction(vectors[d], _demand_vector(description, accounting), live)
        except ValueError as exc:
            raise _problem("pipelines", w.pipeline_ids, np.asarray(w.demand) == d, str(exc)) from None
    return low
