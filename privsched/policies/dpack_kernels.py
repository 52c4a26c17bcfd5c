"""DPack's per-grant loops, compiled with Numba (Tholoniat et al., EuroSys'25; docs/design.md §4.2).

A DPack pass is about n / k rounds of k grants, and each round changes little: the blocks
its grants touch and the candidates near the top. Worked as whole NumPy arrays, every
round paid a few hundred array calls whatever it changed; here a round costs what it
changes. :mod:`privsched.policies.dpack` and :mod:`privsched.policies.packing` hold the
rules and their set-up; this module holds only the loops they run:

- the packing counts (the rule in :mod:`privsched.policies.packing`): lay the demands
  out, count each prefix, drop granted demands, shorten prefixes, pick best orders;
- the pass: a binary heap of candidates keyed by a lower bound on their urgency (minus
  the efficiency), evaluated lazily, walked best-effort in exact order, k grants a round.

Costs, fit tests and charges are the floating-point operations of the definition, in the
same order (a pipeline's cost is summed as ``np.add.reduceat`` sums a segment: the first
term plus NumPy's pairwise sum of the rest; budgets are charged one grant after another),
so the grants are those of the literal reference wherever the packing sums are exact.
Importing this module imports Numba; the policies import it only when a DPack pass runs.
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, error_model="numpy", nogil=True)


# -- packing counts --------------------------------------------------------------------------
# ``state`` is the tuple (columns, first, size, values, removed, row_of, prefix, total,
# count, best) that :class:`privsched.policies.packing.Packing` holds; its docstring
# explains each array.


@_jit
def build_packing(sorted_edges, demand, available, live, state):  # pragma: no cover
    """Lay the demands out in sorted order and take each (block, column)'s longest fitting
    prefix, summing smallest first as the definition does; then every block's best order."""
    columns, first, size, values, removed, row_of, prefix, total, count, best = state
    for b in range(len(first)):
        f, n = first[b], size[b]
        for c in range(len(columns)):
            column, limit = columns[c], available[b, columns[c]]
            for i in range(n):
                e = sorted_edges[f + i, c]
                values[c, f + i] = demand[e, column]
                removed[c, f + i] = False
                row_of[e, c] = f + i
            running, position = 0.0, 0
            while position < n and running + values[c, f + position] <= limit:
                running += values[c, f + position]
                position += 1
            prefix[b, c], total[b, c], count[b, c] = position, running, position
        if n:
            best[b] = _best_of_block(b, available, live, state)


@_jit
def table_keys(block, demand_bits, columns, first, size, low, keys, by_block):  # pragma: no cover
    """Group the edges by block (``by_block``, ascending within a block, as a stable sort
    does) and fill ``keys[c, j, i]`` with the bits of the demand at ``columns[c]`` of block
    j's i-th edge, its lowest bits (``low``) replaced by i; the rows are padded with +inf.
    The bits of a non-negative double (−0 taken as +0) sort as the double does, so one sort
    of each row orders it up to those low bits and says where every value came from. The
    demands are read in order, once."""
    high = ~low
    padding = np.uint64(0x7FF0000000000000) & high  # +inf
    negative_zero = np.uint64(0x8000000000000000)
    filled = np.zeros(len(first), dtype=np.int64)
    for e in range(len(block)):
        b = block[e]
        i = filled[b]
        filled[b] = i + 1
        by_block[first[b] + i] = e
        for c in range(len(columns)):
            bits = demand_bits[e, columns[c]]
            if bits == negative_zero:
                bits = np.uint64(0)
            keys[c, b, i] = (bits & high) | np.uint64(i)
    for b in range(len(first)):
        for i in range(size[b], keys.shape[2]):
            for c in range(len(columns)):
                keys[c, b, i] = padding | np.uint64(i)


@_jit
def edges_in_order(keys, low, by_block, demand, columns, first, size, sorted_edges):  # pragma: no cover
    """From rows of ``keys`` sorted by :func:`table_keys`' integers: each block's edges in
    exact ascending demand, per column (``sorted_edges[first_j + i, c]``). An insertion
    pass on the values puts in order the few that differed only in their low bits: linear
    in a row's length when it is nearly sorted already, and stable. Block by block, so that
    a block's demands are read from memory once for all its columns."""
    values = np.empty(keys.shape[2])
    slots = np.empty(keys.shape[2], dtype=np.int64)
    for b in range(len(first)):
        f, n = first[b], size[b]
        for c in range(keys.shape[0]):
            placed = 0
            for i in range(keys.shape[2]):
                slot = np.int64(keys[c, b, i] & low)
                if slot >= n:
                    continue  # padding
                value = demand[by_block[f + slot], columns[c]]
                j = placed - 1
                while j >= 0 and values[j] > value:
                    values[j + 1], slots[j + 1] = values[j], slots[j]
                    j -= 1
                values[j + 1], slots[j + 1] = value, slot
                placed += 1
            for i in range(n):
                sorted_edges[f + i, c] = by_block[f + slots[i]]


@_jit
def _remove_edge(e, block, demand, state):  # pragma: no cover
    """A granted edge stops counting as pending; inside a prefix it leaves the count and
    the sum (the budget lost the same demand, so the rest of the prefix still fits)."""
    columns, first, size, values, removed, row_of, prefix, total, count, best = state
    b = block[e]
    for c in range(len(columns)):
        row = row_of[e, c]
        removed[c, row] = True
        if row - first[b] < prefix[b, c]:
            total[b, c] -= demand[e, columns[c]]
            count[b, c] -= 1


@_jit
def remove_edges(edges, block, demand, state):  # pragma: no cover
    """Granted edges stop counting as pending."""
    for e in edges:
        _remove_edge(e, block, demand, state)


@_jit
def _best_of_block(b, available, live, state):  # pragma: no cover
    """Shorten each live column's prefix of block b until it fits ``available`` again;
    returns the order with the largest count (ties: the smallest; dead orders count −1)."""
    columns, first, size, values, removed, row_of, prefix, total, count, best = state
    f = first[b]
    top, top_count = 0, -2
    for c in range(len(columns)):
        counted = -1
        if live[b, columns[c]]:
            limit, position = available[b, columns[c]], prefix[b, c]
            while position > 0 and total[b, c] > limit:
                position -= 1
                if not removed[c, f + position]:
                    total[b, c] -= values[c, f + position]
                    count[b, c] -= 1
            prefix[b, c] = position
            counted = count[b, c]
        if counted > top_count:
            top, top_count = c, counted
    return columns[top]


@_jit
def refresh_best(blocks, available, live, state, changed):  # pragma: no cover
    """Recount ``blocks`` (distinct, each with ≥ 1 edge) and update their best order;
    writes the blocks whose best order changed to ``changed`` and returns how many."""
    best = state[9]
    n_changed = 0
    for b in blocks:
        order = _best_of_block(b, available, live, state)
        if order != best[b]:
            best[b] = order
            changed[n_changed] = b
            n_changed += 1
    return n_changed


# -- costs and the fit test --------------------------------------------------------------------


@_jit
def _pairwise_sum(values, lo, hi):  # pragma: no cover
    """NumPy's pairwise summation of ``values[lo:hi]`` (its reduction loop, bit for bit)."""
    n = hi - lo
    if n < 8:
        total = -0.0
        for i in range(lo, hi):
            total += values[i]
        return total
    if n <= 128:
        r = values[lo : lo + 8].copy()
        i = 8
        while i < n - n % 8:
            for j in range(8):
                r[j] += values[lo + i + j]
            i += 8
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            total += values[lo + i]
            i += 1
        return total
    half = n // 2
    half -= half % 8
    return _pairwise_sum(values, lo, lo + half) + _pairwise_sum(values, lo + half, hi)


@_jit
def segment_sum(values, lo, hi):  # pragma: no cover
    """``np.add.reduceat(values, [lo])[0]`` for the segment ``values[lo:hi]`` (hi > lo)."""
    return values[lo] + _pairwise_sum(values, lo + 1, hi)


@_jit
def _edge_cost(e, block, demand, available, best, is_rdp):  # pragma: no cover
    """The edge's demand as a fraction of its block's remaining budget: at the block's best
    order under RDP, the binding dimension under basic accounting; 0 for a zero demand and
    infinite on a block with no budget left."""
    b = block[e]
    if is_rdp:
        column = best[b]
        wanted, budget = demand[e, column], available[b, column]
        if wanted > 0:
            return wanted / budget if budget > 0 else np.inf
        return 0.0
    cost = 0.0
    for column in range(demand.shape[1]):
        wanted, budget = demand[e, column], available[b, column]
        ratio = 0.0
        if wanted > 0:
            ratio = wanted / budget if budget > 0 else np.inf
        if ratio > cost:
            cost = ratio
    return cost


@_jit
def _urgency(p, start, count, weight, block, demand, available, best, is_rdp, seen):  # pragma: no cover
    """Minus the efficiency of pipeline p, ``−w / Σ_j cost_j`` (NaN sorts last, as +∞)."""
    cost = 0.0
    if count[p]:
        for i in range(count[p]):
            seen[start[p] + i] = _edge_cost(start[p] + i, block, demand, available, best, is_rdp)
        cost = segment_sum(seen, start[p], start[p] + count[p])
    urgency = -weight[p] / cost if weight[p] > 0 else 0.0
    return np.inf if urgency != urgency else urgency


@_jit
def _fits(p, start, count, block, demand, available, live, is_rdp):  # pragma: no cover
    """Whether pipeline p's whole demand fits ``available`` (docs/design.md §3.3)."""
    for e in range(start[p], start[p] + count[p]):
        b = block[e]
        if is_rdp:
            some = False
            for column in range(demand.shape[1]):
                if live[b, column] and demand[e, column] <= available[b, column]:
                    some = True
                    break
            if not some:
                return False
        else:
            for column in range(demand.shape[1]):
                if not demand[e, column] <= available[b, column]:
                    return False
    return True


@_jit
def fitting_alone(start, count, block, demand, available, live, is_rdp):  # pragma: no cover
    """The pipelines whose whole demand fits ``available`` on its own, ascending."""
    fitting = np.empty(len(start), dtype=np.intp)
    n = 0
    for p in range(len(start)):
        if _fits(p, start, count, block, demand, available, live, is_rdp):
            fitting[n] = p
            n += 1
    return fitting[:n]


@_jit
def _moved_since(p, evaluated, start, count, block, moved):  # pragma: no cover
    """Whether one of pipeline p's blocks was granted anything after round ``evaluated``."""
    for e in range(start[p], start[p] + count[p]):
        if moved[block[e]] > evaluated:
            return True
    return False


# -- the candidate heap ----------------------------------------------------------------------------
# Entries are rows (key, tie, pipeline, version) of one float array, ascending by (key, tie),
# so that comparing two entries reads one cache line each; ties, pipelines and versions are
# integers far below 2⁵³, exact as floats.


@_jit
def _less(heap, i, j):  # pragma: no cover
    return heap[i, 0] < heap[j, 0] or (heap[i, 0] == heap[j, 0] and heap[i, 1] < heap[j, 1])


@_jit
def _swap(heap, i, j):  # pragma: no cover
    for c in range(4):
        heap[i, c], heap[j, c] = heap[j, c], heap[i, c]


@_jit
def _sift_down(heap, size, i):  # pragma: no cover
    while True:
        smallest, left = i, 2 * i + 1
        if left < size and _less(heap, left, smallest):
            smallest = left
        if left + 1 < size and _less(heap, left + 1, smallest):
            smallest = left + 1
        if smallest == i:
            return
        _swap(heap, i, smallest)
        i = smallest


@_jit
def _push(heap, size, key, tie, item, version):  # pragma: no cover
    """Add an entry; returns the new size."""
    heap[size, 0], heap[size, 1], heap[size, 2], heap[size, 3] = key, tie, item, version
    i = size
    while i > 0:
        parent = (i - 1) // 2
        if not _less(heap, i, parent):
            break
        _swap(heap, i, parent)
        i = parent
    return size + 1


@_jit
def _drop_top(heap, size):  # pragma: no cover
    """Remove the smallest entry; returns the new size."""
    size -= 1
    if size:
        for c in range(4):
            heap[0, c] = heap[size, c]
        _sift_down(heap, size, 0)
    return size


# -- the pass ------------------------------------------------------------------------------------


@_jit
def run_pass(
    candidates,
    start,
    count,
    weight,
    tie,
    block,
    demand,
    available,
    live,
    is_rdp,
    k,
    edge_pipeline,
    by_block,
    state,
):  # pragma: no cover
    """The whole DPack pass from the candidates that fit alone; ``available`` is charged in
    place. Returns the granted pipelines in grant order.

    Invariant: every queued pipeline's heap key is at most its urgency now (module
    docstring of :mod:`privsched.policies.dpack`); ``fresh[p] == round`` when
    ``urgency[p]`` is exact for the round (against the round's starting budget). An
    urgency evaluated in round r stays exact while none of the pipeline's blocks has been
    granted anything since (``moved[b] ≤ r``): its budgets and best orders are unchanged.
    """
    columns, first, size, best = state[0], state[1], state[2], state[9]
    n = len(start)
    seen = np.empty(len(block))  # each edge's cost at its pipeline's latest evaluation
    urgency = np.zeros(n)
    fresh = np.full(n, -1, dtype=np.int64)
    queued = np.zeros(n, dtype=np.bool_)
    entry_key = np.zeros(n)
    current = np.zeros(n, dtype=np.int64)  # version of each pipeline's live entry
    capacity = 2 * len(candidates) + 16
    heap = np.empty((capacity, 4))
    size_heap, live_entries = 0, 0
    granted = np.empty(len(candidates), dtype=np.int64)
    n_granted = 0
    changed = np.empty(len(first), dtype=np.int64)
    touched = np.zeros(len(first), dtype=np.bool_)
    touched_list = np.empty(len(first), dtype=np.int64)
    basis = available.copy()  # the budget at the round's start
    moved = np.zeros(len(available), dtype=np.int64)  # first round that sees a block's latest grant
    round_ = 0
    for p in candidates:
        urgency[p] = _urgency(p, start, count, weight, block, demand, available, best, is_rdp, seen)
        fresh[p] = 0
    pushes = candidates.copy()
    n_pushes = len(candidates)
    while True:
        # Push the pending re-queues (a compaction first when the heap is full).
        if size_heap + n_pushes > capacity:
            kept = 0
            for i in range(size_heap):
                p = np.int64(heap[i, 2])
                if heap[i, 3] == current[p] and queued[p]:
                    heap[kept] = heap[i]
                    kept += 1
            size_heap = kept
            for i in range(size_heap // 2 - 1, -1, -1):
                _sift_down(heap, size_heap, i)
        for i in range(n_pushes):
            p = pushes[i]
            if not queued[p]:
                queued[p] = True
                live_entries += 1
            current[p] += 1
            entry_key[p] = urgency[p]
            size_heap = _push(heap, size_heap, urgency[p], tie[p], p, current[p])
        n_pushes = 0
        if not live_entries:
            break  # the pass is over: nothing to refresh
        # One round: the next k grants in exact order as of the round's start.
        round_grants = n_granted
        need = k
        while need and live_entries:
            top_key, p, v = heap[0, 0], np.int64(heap[0, 2]), np.int64(heap[0, 3])
            if v != current[p] or not queued[p]:
                size_heap = _drop_top(heap, size_heap)
                continue  # a replaced entry
            if fresh[p] < round_:
                if _moved_since(p, fresh[p], start, count, block, moved):
                    if not _fits(p, start, count, block, demand, available, live, is_rdp):
                        queued[p] = False  # budget only shrinks within a pass: it never fits again,
                        live_entries -= 1  # and where it would have come in the order grants nothing
                        size_heap = _drop_top(heap, size_heap)
                        continue
                    urgency[p] = _urgency(p, start, count, weight, block, demand, basis, best, is_rdp, seen)
                fresh[p] = round_
            if top_key != urgency[p]:  # a lower bound: the entry takes its exact key, in place
                entry_key[p] = urgency[p]
                heap[0, 0] = urgency[p]
                _sift_down(heap, size_heap, 0)
                continue
            size_heap = _drop_top(heap, size_heap)
            queued[p] = False
            live_entries -= 1
            if _fits(p, start, count, block, demand, available, live, is_rdp):
                for e in range(start[p], start[p] + count[p]):
                    for column in range(demand.shape[1]):
                        available[block[e], column] -= demand[e, column]
                granted[n_granted] = p
                n_granted += 1
                need -= 1
            # else: budget only shrinks within a pass, so it never fits later
        if not live_entries:
            break
        round_ += 1
        # Refresh: the round's grants leave the packing counts; their blocks are recounted,
        # and are the only rows of the next round's starting budget that differ.
        recount = is_rdp and len(columns) > 0
        n_touched = 0
        for g in range(round_grants, n_granted):
            p = granted[g]
            for e in range(start[p], start[p] + count[p]):
                b = block[e]
                moved[b] = round_
                if recount:
                    _remove_edge(e, block, demand, state)
                if not touched[b]:
                    touched[b] = True
                    touched_list[n_touched] = b
                    n_touched += 1
        for i in range(n_touched):
            b = touched_list[i]
            touched[b] = False
            basis[b] = available[b]
        if not recount:
            continue
        n_changed = refresh_best(touched_list[:n_touched], available, live, state, changed)
        # Costs on a block whose best order moved may fall: re-evaluate its queued
        # pipelines now, and queue again those whose key is no longer a lower bound.
        for i in range(n_changed):
            b = changed[i]
            for j in range(first[b], first[b] + size[b]):
                e = by_block[j]
                p = edge_pipeline[e]
                # Its other costs can only have grown since: if this one did not fall,
                # neither did the sum, and the key stays a lower bound.
                if queued[p] and fresh[p] < round_ and _edge_cost(e, block, demand, available, best, is_rdp) < seen[e]:
                    urgency[p] = _urgency(p, start, count, weight, block, demand, available, best, is_rdp, seen)
                    fresh[p] = round_
                    if urgency[p] < entry_key[p]:
                        pushes[n_pushes] = p
                        n_pushes += 1
    return granted[:n_granted]
