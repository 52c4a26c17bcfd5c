"""A pipeline's life-cycle transitions (docs/design.md §4.4): submit, grant, start, complete,
fail, cancel (and the request to stop a running job), release, expire.

Each is a plain function over a :class:`~privsched.ledger.transaction.Transaction`, run by
the façade as one write transaction that makes all its checks inside it; an error raised
here rolls the whole transaction back. Arguments were checked before the transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from privsched.budgets.accounting import leq
from privsched.budgets.exact import quantize
from privsched.ledger import launches
from privsched.ledger import validation as check
from privsched.ledger.errors import LedgerError
from privsched.ledger.models import HOLDING_STATES, Ending, PipelineRequest
from privsched.ledger.moves import Moves, detail_text, settle
from privsched.ledger.quotas import QuotaCheck
from privsched.ledger.reuse import ANSWERED_FROM_CACHE, REUSED_FROM, record_cache_answer, record_reuse
from privsched.ledger.schema import pack, unpack, unpack_rows
from privsched.ledger.transaction import Transaction

if TYPE_CHECKING:
    import numpy as np

_SET_CONSUMED = "UPDATE demands SET consumed = ? WHERE pipeline_id = ? AND block_id = ?"


def submit_many(
    tx: Transaction, requests: list[PipelineRequest], actors: list[str] | None, claim: Callable[[list[int]], None] | None
) -> list[int]:
    """Record pending pipelines (all or none), each submitted by its actor (default: the
    transaction's); ``claim(ids)`` runs inside the transaction. A request whose job names
    a release it reuses, or that carries its answer from the cache, is completed at once, at
    no charge (:mod:`privsched.ledger.reuse`)."""
    ids = []
    for i, request in enumerate(requests):
        if actors is not None:
            tx.moves.actor = actors[i]
        ids.append(_insert_pipeline(tx, request))
        job = request.job if isinstance(request.job, dict) else {}
        if job.get(REUSED_FROM) is not None:
            record_reuse(tx, ids[-1], check.ids([job[REUSED_FROM]], "reused pipeline id")[0])
        elif job.get(ANSWERED_FROM_CACHE) is not None:
            record_cache_answer(tx, ids[-1], job[ANSWERED_FROM_CACHE])
    if claim is not None:
        claim(ids)
    return ids


def _insert_pipeline(tx: Transaction, request: PipelineRequest) -> int:
    if not isinstance(request, PipelineRequest):
        raise LedgerError(f"expected a PipelineRequest, got {type(request).__name__}")
    name = check.name(request.name, "pipeline name")
    info = tx.read.dataset(request.dataset)
    weight = check.finite_number(request.weight, "weight", low_open=True)
    timeout = None if request.timeout is None else check.finite_number(request.timeout, "timeout", low_open=True)
    if request.owner != "":  # no owner recorded
        check.name(request.owner, "owner")
    job = check.json_text(request.job, "job")
    resources = check.json_text(request.resources, "resources")
    # On the exact quantum grid, rounded up (a decimal such as 0.1 is kept as it is).
    demands = {key: quantize(d, up=True) for key, d in check.request_demands(request, info.accounting, info.capacity).items()}
    keys = list(demands)
    found = {
        key: (block_id, state, unpack(capacity))
        for key, block_id, state, capacity in tx.sql(
            "SELECT b.key, b.id, b.state, bal.capacity FROM blocks b JOIN balances bal ON bal.block_id = b.id "
            "WHERE b.dataset_id = ? AND b.key IN (SELECT value FROM json_each(?))",
            [info.id, json.dumps(keys)],
        )
    }
    for key in keys:
        if key not in found:
            raise LedgerError(f"unknown block {key!r} in dataset {info.name!r}")
        block_id, state, capacity = found[key]
        if state != "active":
            raise LedgerError(f"block {key!r} of dataset {info.name!r} is {state}")
        if not info.accounting.fits(demands[key], capacity, info.accounting.live(capacity)):
            where = "at every live order" if info.accounting.is_rdp else "in some dimension"
            raise LedgerError(f"pipeline {name!r} can never be granted: its demand exceeds the capacity of block {key!r} {where}")
    elastic_min = check.elastic_min(request.elastic_min)
    cursor = tx.db.execute(
        "INSERT INTO pipelines (name, dataset_id, state, owner, weight, timeout, submitted_at, mechanism, job, "
        "resources, elastic_min) VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?)",
        [name, info.id, request.owner, weight, timeout, tx.at, request.mechanism, job, resources, elastic_min],
    )
    pipeline_id = int(cursor.lastrowid or 0)  # set by the INSERT
    tx.db.conn.executemany(
        "INSERT INTO demands (pipeline_id, block_id, position, demand) VALUES (?, ?, ?, ?)",
        [(pipeline_id, found[key][0], i, pack(demands[key])) for i, key in enumerate(keys)],
    )
    submitted = {
        "name": name,
        "owner": request.owner,
        "weight": weight,
        "timeout": timeout,
        "mechanism": request.mechanism,
        "job": job,
        "resources": resources,
        "demands": [[found[key][0], demands[key].tolist()] for key in keys],
    }
    if elastic_min is not None:
        submitted["elastic_min"] = elastic_min
    tx.moves.state_event("submit", None, "pending", dataset_id=info.id, pipeline_id=pipeline_id, detail=detail_text(submitted))
    return pipeline_id


def grant(tx: Transaction, ids: list[int], fractions: Mapping[int, float] | None = None) -> list[int]:
    """Grant pipelines in order, each all or nothing over its blocks against the unlocked
    budget (``Accounting.fits``; docs/design.md §3.3) and its team's quota; the granted ids.
    A pipeline given a fraction f (default 1) is granted f · its demand on every block
    (:func:`~privsched.budgets.elastic.granted_amount`); f must lie in [its elastic_min, 1]."""
    listed = json.dumps(sorted(set(ids)))
    found = tx.sql("SELECT id, state, elastic_min FROM pipelines WHERE id IN (SELECT value FROM json_each(?))", [listed])
    states = {pipeline_id: state for pipeline_id, state, _ in found}
    unknown = [i for i in ids if i not in states]
    if unknown:
        raise LedgerError(f"unknown pipeline {unknown[0]}")
    shares = {pipeline_id: _fraction(pipeline_id, least, fractions) for pipeline_id, _, least in found}
    edges: dict[int, list[tuple[int, bytes]]] = {i: [] for i in states}
    for pipeline_id, block_id, demand in tx.sql(
        "SELECT pipeline_id, block_id, demand FROM demands WHERE pipeline_id IN (SELECT value FROM json_each(?)) "
        "ORDER BY pipeline_id, position",
        [listed],
    ):
        edges[pipeline_id].append((block_id, demand))
    tx.moves.load(b for pending in edges.values() for b, _ in pending)
    quotas = QuotaCheck.load(tx.db)
    granted = []
    for pipeline_id in ids:
        if states[pipeline_id] != "pending" or not edges[pipeline_id]:
            continue
        if _allocate(tx, pipeline_id, edges[pipeline_id], quotas, shares[pipeline_id]):
            states[pipeline_id] = "granted"
            granted.append(pipeline_id)
    tx.db.conn.executemany(
        "UPDATE pipelines SET state = 'granted', granted_at = ?, fraction = ? WHERE id = ? AND state = 'pending'",
        [(tx.at, shares[pipeline_id], pipeline_id) for pipeline_id in granted],
    )
    return granted


def _fraction(pipeline_id: int, least: float | None, fractions: Mapping[int, float] | None) -> float | None:
    """The fraction of its demand a pipeline is to be granted (None: all of it), checked to
    be within [its least accepted fraction, 1]."""
    fraction = None if fractions is None else fractions.get(pipeline_id)
    if fraction is None or fraction == 1.0:
        return None
    if not (0.0 < fraction <= 1.0) or fraction < (1.0 if least is None else least):
        raise LedgerError(f"pipeline {pipeline_id} accepts a fraction of its demand from {least or 1.0:g} to 1, not {fraction!r}")
    return float(fraction)


def _allocate(tx: Transaction, pipeline_id: int, edges: list[tuple[int, bytes]], quotas: QuotaCheck | None, fraction: float | None) -> bool:
    """Allocate ``fraction`` of a pipeline's demand (None: all of it) on every block if it
    fits on all of them (and within its team's quota, :mod:`privsched.ledger.quotas`)."""
    import numpy as np

    from privsched.budgets.elastic import granted_amount

    moves = tx.moves
    block_ids = [b for b, _ in edges]
    if any(moves.states[b] != "active" for b in block_ids):
        return False
    dataset_id = moves.datasets[block_ids[0]]
    accounting = tx.read.dataset_by_id(dataset_id).accounting
    demand = granted_amount(unpack_rows([d for _, d in edges], accounting.dims), fraction)
    unlocked = np.stack([moves.balances[b]["unlocked"] for b in block_ids])
    capacity = np.stack([moves.balances[b]["capacity"] for b in block_ids])
    if not np.all(accounting.fits(demand, unlocked, accounting.live(capacity))):
        return False
    if quotas is not None and not quotas.take(pipeline_id, dataset_id, block_ids, demand, capacity, accounting):
        return False
    for block_id, amount in zip(block_ids, demand):
        moves.move(block_id, "unlocked", "allocated", amount, kind="grant", pipeline_id=pipeline_id)
    detail = None if fraction is None else detail_text({"fraction": fraction})
    moves.state_event("grant", "pending", "granted", dataset_id=dataset_id, pipeline_id=pipeline_id, detail=detail)
    return True


def mark_running(tx: Transaction, pipeline_id: int, placement: str, launch_token: str | None) -> None:
    """granted → running, where it runs, and (with a token) that its launch began."""
    _, dataset_id = tx.read.pipeline_state(pipeline_id, ("granted",), "start")
    tx.db.execute("UPDATE pipelines SET state = 'running', started_at = ?, placement = ? WHERE id = ?", [tx.at, placement, pipeline_id])
    tx.moves.state_event("run", "granted", "running", dataset_id=dataset_id, pipeline_id=pipeline_id)
    if launch_token is not None:
        launches.record_launching(tx.db, pipeline_id, launch_token, tx.generation, tx.at)


def record_started(tx: Transaction, pipeline_id: int, token: str, pid: int | None, start_ticks: str | None) -> None:
    """A running pipeline's job process exists (launching → started)."""
    if not launches.record_started(tx.db, pipeline_id, token, pid, start_ticks, tx.at):
        raise LedgerError(f"pipeline {pipeline_id} has no launch {token!r}")


def complete(tx: Transaction, pipeline_id: int, spent: np.ndarray | Mapping[str, np.ndarray]) -> None:
    """running (or granted) → completed: what the job spent (≤ its grant, per block, in
    every dimension) allocated → consumed, the rest allocated → unlocked."""
    import numpy as np

    state, dataset_id, edges = tx.read.pipeline_edges(pipeline_id, HOLDING_STATES, "complete")
    accounting = tx.read.dataset_by_id(dataset_id).accounting
    per_block = check.spent_per_block(spent, [key for _, key, _ in edges], accounting)
    tx.moves.load(b for b, _, _ in edges)
    consumed = []
    for block_id, key, demand in edges:
        used = per_block[key]
        over = ~leq(used, demand)
        if over.any():
            labels = ", ".join(lbl for lbl, bad in zip(accounting.dimension_labels(), over) if bad)
            raise LedgerError(f"pipeline {pipeline_id} spent more than its grant on block {key!r} at {labels}")
        used = settle(tx.moves, pipeline_id, block_id, demand, np.minimum(used, demand), kind="complete")
        consumed.append((pack(used), pipeline_id, block_id))
    tx.db.conn.executemany(_SET_CONSUMED, consumed)
    _finish(tx, pipeline_id, dataset_id, state, "completed", "complete")


def fail(tx: Transaction, pipeline_id: int, message: str, touched_data: bool) -> None:
    """→ failed. A job that touched data consumes its whole allocation (a partial model may
    already have leaked); one that did not releases it (docs/design.md §4.4)."""
    import numpy as np

    state, dataset_id, edges = tx.read.pipeline_edges(pipeline_id, ("pending", *HOLDING_STATES), "fail")
    if state in HOLDING_STATES:
        tx.moves.load(b for b, _, _ in edges)
        consumed = []
        for block_id, _, demand in edges:
            used = settle(
                tx.moves, pipeline_id, block_id, demand, demand if touched_data else np.zeros_like(demand), kind="fail", reason=message
            )
            consumed.append((pack(used), pipeline_id, block_id))
        tx.db.conn.executemany(_SET_CONSUMED, consumed)
    _finish(tx, pipeline_id, dataset_id, state, "failed", "fail", message=message)


def settle_many(tx: Transaction, endings: list[Ending]) -> None:
    """Each ending's :func:`complete` or :func:`fail`, in order, in one transaction; every
    failure's events are caused by its ending's actor (default: the transaction's)."""
    caused_by = tx.moves.actor
    for ending in endings:
        tx.moves.actor = ending.actor or caused_by
        if ending.spent is not None:
            complete(tx, ending.pipeline_id, ending.spent)
        else:
            fail(tx, ending.pipeline_id, ending.message, ending.touched_data)
    tx.moves.actor = caused_by


def cancel(tx: Transaction, pipeline_id: int) -> None:
    """pending → cancelled; granted (job not started) → cancelled, allocation released."""
    state, dataset_id = tx.read.pipeline_state(pipeline_id, ("pending", "granted"), "cancel")
    if state == "granted":
        import numpy as np

        _, _, edges = tx.read.pipeline_edges(pipeline_id, ("granted",), "cancel")
        tx.moves.load(b for b, _, _ in edges)
        for block_id, _, demand in edges:
            settle(tx.moves, pipeline_id, block_id, demand, np.zeros_like(demand), kind="cancel")
    message = "cancelled while waiting for a grant" if state == "pending" else "cancelled before its job started (its grant was released)"
    _finish(tx, pipeline_id, dataset_id, state, "cancelled", "cancel", message=message)


def request_stop(tx: Transaction, pipeline_id: int) -> None:
    """A request to cancel a running pipeline, by the transaction's actor: a ``stop`` event
    (running → running) that names who asked; the scheduler then stops the job and fails the
    pipeline in that actor's name (docs/design.md §4.4)."""
    _, dataset_id = tx.read.pipeline_state(pipeline_id, ("running",), "cancel")
    tx.moves.state_event("stop", "running", "running", dataset_id=dataset_id, pipeline_id=pipeline_id, reason="cancel requested")


def release(tx: Transaction, pipeline_id: int, reason: str) -> None:
    """Admin act: a failed pipeline's consumed budget → unlocked, the reason kept in the
    event log (docs/design.md §4.4)."""
    import numpy as np

    _, dataset_id, edges = tx.read.pipeline_edges(pipeline_id, ("failed",), "release")
    spent = dict(tx.sql("SELECT block_id, consumed FROM demands WHERE pipeline_id = ?", [pipeline_id]))
    tx.moves.load(b for b, _, _ in edges)
    released = []
    for block_id, _, demand in edges:
        amount = unpack(spent[block_id]) if spent[block_id] is not None else np.zeros_like(demand)
        if np.any(amount > 0):
            tx.moves.move(block_id, "consumed", "unlocked", amount, kind="release", pipeline_id=pipeline_id, reason=reason)
            released.append((pack(np.zeros_like(demand)), pipeline_id, block_id))
    if not released:
        raise LedgerError(f"pipeline {pipeline_id} has no consumed budget to release")
    tx.db.conn.executemany(_SET_CONSUMED, released)
    tx.moves.state_event("release", "failed", "failed", dataset_id=dataset_id, pipeline_id=pipeline_id, reason=reason)


def expire(tx: Transaction) -> list[int]:
    """Pending pipelines past their timeout → timed_out (nothing was allocated)."""
    due = tx.sql(
        "SELECT id, dataset_id, timeout FROM pipelines"
        " WHERE state = 'pending' AND timeout IS NOT NULL AND submitted_at + timeout <= ? ORDER BY id",
        [tx.at],
    )
    for pipeline_id, dataset_id, timeout in due:
        message = f"not granted within its timeout of {timeout:g} s"
        _finish(tx, pipeline_id, dataset_id, "pending", "timed_out", "expire", message=message)
    return [pipeline_id for pipeline_id, _, _ in due]


def _finish(tx: Transaction, pipeline_id: int, dataset_id: int, old: str, new: str, kind: str, message: str | None = None) -> None:
    moves: Moves = tx.moves
    tx.db.execute(
        "UPDATE pipelines SET state = ?, finished_at = ?, message = coalesce(?, message) WHERE id = ?",
        [new, moves.now, message, pipeline_id],
    )
    moves.state_event(kind, old, new, dataset_id=dataset_id, pipeline_id=pipeline_id, reason=message)
