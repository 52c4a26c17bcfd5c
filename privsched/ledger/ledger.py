"""The budget ledger: the single source of truth, and the only place budget moves.

Every public method that moves budget or changes state is one ``BEGIN IMMEDIATE``
transaction that makes all its checks inside the transaction and appends to the ``events``
log, from which every balance can be recomputed (:meth:`Ledger.audit`). Errors a caller can
cause raise :class:`LedgerError` and change nothing (docs/design.md §6; life cycle: docs/design.md §4.4).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from privsched.budgets.accounting import leq
from privsched.budgets.capacity import CONVERSIONS, block_capacity, validate_epsilon_delta
from privsched.ledger import launches, lease, rows
from privsched.ledger import validation as check
from privsched.ledger.audit import audit_database
from privsched.ledger.chain import parse_head
from privsched.ledger.changes import Changes, read_changes
from privsched.ledger.connection import open_database, run_transaction
from privsched.ledger.errors import LedgerError
from privsched.ledger.models import (
    HOLDING_STATES,
    PIPELINE_STATES,
    AuditReport,
    BlockInfo,
    BlockSpec,
    DatasetInfo,
    Event,
    PendingView,
    PipelineInfo,
    PipelineRequest,
)
from privsched.ledger.moves import Moves, detail_text, settle
from privsched.ledger.quotas import QuotaCheck
from privsched.ledger.schema import pack, unpack, unpack_rows

T = TypeVar("T")


class Ledger:
    """Privacy budget accounts of datasets, blocks and pipelines in one SQLite file.

    Safe to open from many processes at once; one instance may be shared by threads
    (its transactions are serialised)."""

    def __init__(self, path: str | os.PathLike, *, create: bool = False) -> None:
        self.path = Path(path)
        self.db = open_database(self.path, create=create)
        self._datasets: dict[int, DatasetInfo] = {}
        self._lock = threading.RLock()  # one transaction at a time on this connection
        self._fence: tuple[str, int] | None = None  # (holder, generation) while this ledger holds the lease

    @classmethod
    def init(cls, path: str | os.PathLike) -> Ledger:
        """Create a ledger file (an existing privsched database is just opened)."""
        return cls(path, create=True)

    def close(self) -> None:
        with self._lock:
            self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    # ----------------------------------------------------------------- transactions
    def _write(self, body: Callable[[], T]) -> T:
        """One write transaction; while this ledger holds the scheduler lease, it first checks,
        inside the transaction, that the lease was not taken over since (lease module)."""
        with self._lock:
            fence = self._fence
            if fence is None:
                return run_transaction(self.db, body)

            def fenced() -> T:
                lease.check_fence(self.db, *fence)
                return body()

            return run_transaction(self.db, fenced)

    def _lease_write(self, body: Callable[[], T]) -> T:
        with self._lock:
            return run_transaction(self.db, body)

    def _read(self, body: Callable[[], T]) -> T:
        with self._lock:
            return run_transaction(self.db, body, immediate=False)

    def _sql(self, sql: str, params: Sequence | None = None) -> list[tuple]:
        return self.db.execute(sql, params or []).fetchall()

    # --------------------------------------------------------------------- datasets
    def create_dataset(
        self,
        name: str,
        epsilon: float,
        delta: float,
        accounting: str = "rdp",
        alphas: Sequence[float] | None = None,
        conversion: str = "paper",
        now: float | None = None,
    ) -> DatasetInfo:
        """Register a dataset with its global guarantee (ε_G, δ_G) and accounting mode; every
        block of it gets capacity ε_G, or the curve ε_G(α) of docs/design.md §3.2 under RDP."""
        name = check.name(name, "dataset name")
        mode = check.accounting_mode(accounting, alphas)
        if conversion not in CONVERSIONS:
            raise LedgerError(f"unknown conversion {conversion!r} (expected one of {', '.join(CONVERSIONS)})")
        try:
            validate_epsilon_delta(epsilon, delta)
            capacity = block_capacity(mode, float(epsilon), float(delta), conversion)  # type: ignore[arg-type]
        except ValueError as exc:
            raise LedgerError(str(exc)) from exc
        if not mode.live(capacity).any():
            raise LedgerError(
                f"no RDP order has positive capacity at epsilon={epsilon:g}, delta={delta:g}: "
                "raise epsilon or delta, or add larger orders"
            )
        at = check.now_or_clock(now)

        def body() -> DatasetInfo:
            if self._sql("SELECT 1 FROM datasets WHERE name = ?", [name]):
                raise LedgerError(f"dataset {name!r} already exists")
            cursor = self.db.execute(
                "INSERT INTO datasets (name, accounting, alphas, epsilon, delta, conversion, capacity, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [name, mode.name, json.dumps(list(mode.alphas)), float(epsilon), float(delta), conversion,
                 pack(capacity), at],
            )
            moves = Moves(self.db, at)
            definition = {"name": name, "accounting": mode.name, "alphas": list(mode.alphas),
                          "epsilon": float(epsilon), "delta": float(delta), "conversion": conversion,
                          "capacity": capacity.tolist()}
            moves.state_event("create", None, "created", dataset_id=cursor.lastrowid, reason=f"dataset {name}",
                              detail=detail_text(definition))
            moves.flush()
            return self._dataset_by_id(cursor.lastrowid)

        return self._write(body)

    def get_dataset(self, name: str) -> DatasetInfo:
        return self._read(lambda: self._dataset(name))

    def list_datasets(self) -> list[DatasetInfo]:
        return [rows.dataset(r) for r in self._read(lambda: self._sql(
            f"SELECT {rows.DATASET_COLUMNS} FROM datasets ORDER BY name"))]

    def _dataset(self, name: str) -> DatasetInfo:
        found = self._sql("SELECT id FROM datasets WHERE name = ?", [name])
        if not found:
            raise LedgerError(f"unknown dataset {name!r}")
        return self._dataset_by_id(found[0][0])

    def _dataset_by_id(self, dataset_id: int) -> DatasetInfo:
        """Datasets never change once created, so each is read once per connection."""
        if dataset_id not in self._datasets:
            row = self._sql(f"SELECT {rows.DATASET_COLUMNS} FROM datasets WHERE id = ?", [dataset_id])[0]
            self._datasets[dataset_id] = rows.dataset(row)
        return self._datasets[dataset_id]

    # ----------------------------------------------------------------------- blocks
    def add_blocks(
        self,
        dataset: str,
        blocks: Sequence[BlockSpec | str],
        unlocked_fraction: float = 0.0,
        now: float | None = None,
    ) -> list[BlockInfo]:
        """Add blocks with the dataset's capacity, all locked except ``unlocked_fraction``."""
        specs = [BlockSpec(b) if isinstance(b, str) else b for b in blocks]
        if not specs:
            raise LedgerError("no blocks to add")
        for spec in specs:
            if not isinstance(spec, BlockSpec):
                raise LedgerError(f"expected a BlockSpec or a key, got {spec!r}")
            check.name(spec.key, "block key")
            if spec.location is not None and not isinstance(spec.location, str):
                raise LedgerError(f"block location must be a string, got {spec.location!r}")
        keys = check.unique((s.key for s in specs), "block key")
        fraction = check.finite_number(unlocked_fraction, "unlocked fraction", high=1.0)
        at = check.now_or_clock(now)

        def body() -> list[BlockInfo]:
            info = self._dataset(dataset)
            taken = self._sql(
                "SELECT key FROM blocks WHERE dataset_id = ? AND key IN (SELECT value FROM json_each(?))",
                [info.id, json.dumps(keys)],
            )
            if taken:
                raise LedgerError(f"block {taken[0][0]!r} already exists in dataset {dataset!r}")
            self.db["blocks"].insert_all(
                {"dataset_id": info.id, "key": s.key, "location": s.location, "state": "active", "created_at": at}
                for s in specs
            )
            ids = dict(self._sql(
                "SELECT key, id FROM blocks WHERE dataset_id = ? AND key IN (SELECT value FROM json_each(?))",
                [info.id, json.dumps(keys)],
            ))
            zero = pack(np.zeros_like(info.capacity))
            self.db.conn.executemany(
                "INSERT INTO balances (block_id, capacity, locked, unlocked, allocated, consumed) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(ids[k], pack(info.capacity), zero, zero, zero, zero) for k in keys],
            )
            moves = Moves(self.db, at)
            locations = {s.key: s.location for s in specs}
            for key in keys:
                moves.add_block(ids[key], info.id, info.capacity, key, locations[key])
                if fraction > 0:
                    moves.move(ids[key], "locked", "unlocked", info.capacity * fraction, kind="unlock")
            moves.flush()
            return self._blocks("b.id IN (SELECT value FROM json_each(?))", [json.dumps(list(ids.values()))])

        return self._write(body)

    def list_blocks(self, dataset: str | None = None, *, active_only: bool = False) -> list[BlockInfo]:
        def body() -> list[BlockInfo]:
            where, params = "1", []
            if dataset is not None:
                where, params = "b.dataset_id = ?", [self._dataset(dataset).id]
            if active_only:
                where += " AND b.state = 'active'"
            return self._blocks(where, params)

        return self._read(body)

    def get_block(self, dataset: str, key: str) -> BlockInfo:
        def body() -> BlockInfo:
            found = self._blocks("b.dataset_id = ? AND b.key = ?", [self._dataset(dataset).id, key])
            if not found:
                raise LedgerError(f"unknown block {key!r} in dataset {dataset!r}")
            return found[0]

        return self._read(body)

    def _blocks(self, where: str, params: Sequence) -> list[BlockInfo]:
        return [rows.block(r) for r in self._sql(
            f"SELECT {rows.BLOCK_COLUMNS} FROM {rows.BLOCK_FROM} WHERE {where} ORDER BY d.name, b.id", params)]

    # -------------------------------------------------------------------- pipelines
    def submit(self, request: PipelineRequest, now: float | None = None) -> int:
        """Record a pending pipeline; reject it (nothing written) if it is malformed or can
        never be granted (docs/design.md §4.4)."""
        return self.submit_many([request], now)[0]

    def submit_many(
        self,
        requests: Sequence[PipelineRequest],
        now: float | None = None,
        *,
        claim: Callable[[list[int]], None] | None = None,
    ) -> list[int]:
        """Submit several pipelines in one transaction: all are recorded, or none.

        ``claim(ids)`` runs inside that transaction once the pipelines are inserted (on
        this ledger's connection): what it writes commits with them, and if it raises,
        nothing is recorded (e.g. who submitted them, under which submission id)."""
        at = check.now_or_clock(now)

        def body() -> list[int]:
            moves = Moves(self.db, at)
            ids = [self._insert_pipeline(request, at, moves) for request in requests]
            moves.flush()
            if claim is not None:
                claim(ids)
            return ids

        return self._write(body)

    def _insert_pipeline(self, request: PipelineRequest, at: float, moves: Moves) -> int:
        if not isinstance(request, PipelineRequest):
            raise LedgerError(f"expected a PipelineRequest, got {type(request).__name__}")
        name = check.name(request.name, "pipeline name")
        info = self._dataset(request.dataset)
        weight = check.finite_number(request.weight, "weight", low_open=True)
        timeout = None if request.timeout is None else check.finite_number(request.timeout, "timeout", low_open=True)
        if request.owner != "":  # no owner recorded
            check.name(request.owner, "owner")
        job = check.json_text(request.job, "job")
        resources = check.json_text(request.resources, "resources")
        demands = check.request_demands(request, info.accounting, info.capacity)
        keys = list(demands)
        found = {
            key: (block_id, state, unpack(capacity))
            for key, block_id, state, capacity in self._sql(
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
                raise LedgerError(
                    f"pipeline {name!r} can never be granted: its demand exceeds the capacity of block "
                    f"{key!r} {where}"
                )
        cursor = self.db.execute(
            "INSERT INTO pipelines (name, dataset_id, state, owner, weight, timeout, submitted_at, mechanism, job, "
            "resources) VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)",
            [name, info.id, request.owner, weight, timeout, at, request.mechanism, job, resources],
        )
        pipeline_id = cursor.lastrowid
        self.db.conn.executemany(
            "INSERT INTO demands (pipeline_id, block_id, position, demand) VALUES (?, ?, ?, ?)",
            [(pipeline_id, found[key][0], i, pack(demands[key])) for i, key in enumerate(keys)],
        )
        submitted = {"name": name, "owner": request.owner, "weight": weight, "timeout": timeout,
                     "mechanism": request.mechanism, "job": job, "resources": resources,
                     "demands": [[found[key][0], demands[key].tolist()] for key in keys]}
        moves.state_event("submit", None, "pending", dataset_id=info.id, pipeline_id=pipeline_id,
                          detail=detail_text(submitted))
        return pipeline_id

    def get_pipeline(self, pipeline_id: int) -> PipelineInfo:
        (pipeline_id,) = check.ids([pipeline_id])

        def body() -> PipelineInfo:
            found = self._pipelines("p.id = ?", [pipeline_id])
            if not found:
                raise LedgerError(f"unknown pipeline {pipeline_id}")
            return found[0]

        return self._read(body)

    def list_pipelines(
        self, states: Iterable[str] | None = None, dataset: str | None = None
    ) -> list[PipelineInfo]:
        wanted = None if states is None else [states] if isinstance(states, str) else list(states)
        for state in wanted or []:
            if state not in PIPELINE_STATES:
                raise LedgerError(f"unknown pipeline state {state!r} (expected one of {', '.join(PIPELINE_STATES)})")

        def body() -> list[PipelineInfo]:
            where, params = ["1"], []
            if wanted is not None:
                where.append("p.state IN (SELECT value FROM json_each(?))")
                params.append(json.dumps(wanted))
            if dataset is not None:
                where.append("p.dataset_id = ?")
                params.append(self._dataset(dataset).id)
            return self._pipelines(" AND ".join(where), params)

        return self._read(body)

    def _pipelines(self, where: str, params: Sequence) -> list[PipelineInfo]:
        found = self._sql(f"SELECT {rows.PIPELINE_COLUMNS} FROM {rows.PIPELINE_FROM} WHERE {where} ORDER BY p.id",
                          params)
        if not found:
            return []
        edges: dict[int, list] = {row[0]: [] for row in found}
        for pipeline_id, key, demand, consumed in self._sql(
            "SELECT e.pipeline_id, b.key, e.demand, e.consumed FROM demands e JOIN blocks b ON b.id = e.block_id "
            "WHERE e.pipeline_id IN (SELECT value FROM json_each(?)) ORDER BY e.pipeline_id, e.position",
            [json.dumps(list(edges))],
        ):
            edges[pipeline_id].append((key, demand, consumed))
        return [rows.pipeline(row, edges[row[0]]) for row in found]

    def _pipeline_edges(
        self, pipeline_id: int, allowed: Sequence[str], action: str
    ) -> tuple[str, int, list[tuple]]:
        """A pipeline's state, dataset id, and (block id, key, demand) edges, checked to be
        in one of the ``allowed`` states."""
        found = self._sql("SELECT state, dataset_id FROM pipelines WHERE id = ?", [pipeline_id])
        if not found:
            raise LedgerError(f"unknown pipeline {pipeline_id}")
        state, dataset_id = found[0]
        if state not in allowed:
            raise LedgerError(f"cannot {action} pipeline {pipeline_id}: it is {state}")
        edges = [
            (block_id, key, unpack(demand))
            for block_id, key, demand in self._sql(
                "SELECT e.block_id, b.key, e.demand FROM demands e JOIN blocks b ON b.id = e.block_id "
                "WHERE e.pipeline_id = ? ORDER BY e.position",
                [pipeline_id],
            )
        ]
        return state, dataset_id, edges

    def _finish(self, moves: Moves, pipeline_id: int, dataset_id: int, old: str, new: str, kind: str,
                message: str | None = None) -> None:
        self.db.execute(
            "UPDATE pipelines SET state = ?, finished_at = ?, message = coalesce(?, message) WHERE id = ?",
            [new, moves.now, message, pipeline_id],
        )
        moves.state_event(kind, old, new, dataset_id=dataset_id, pipeline_id=pipeline_id, reason=message)

    # ----------------------------------------------------------------- budget moves
    def unlock(self, fractions: Mapping[int, float], now: float | None = None) -> None:
        """Unlock ``fraction × capacity`` of each block at every dimension, capped at what is
        still locked (docs/design.md §4.1)."""
        wanted = {}
        for block_id, fraction in dict(fractions).items():
            (block_id,) = check.ids([block_id], "block id")
            wanted[block_id] = check.finite_number(fraction, f"unlock fraction of block {block_id}")
        at = check.now_or_clock(now)

        def body() -> None:
            moves = Moves(self.db, at)
            moves.load(wanted)
            for block_id, fraction in wanted.items():
                if block_id not in moves.balances:
                    raise LedgerError(f"unknown block id {block_id}")
                balance = moves.balances[block_id]
                amount = np.minimum(balance["locked"], balance["capacity"] * fraction)
                if np.any(amount > 0):
                    moves.move(block_id, "locked", "unlocked", np.maximum(amount, 0.0), kind="unlock")
            moves.flush()

        self._write(body)

    def grant(self, pipeline_ids: Sequence[int], now: float | None = None) -> list[int]:
        """Grant pipelines in the given order, each all-or-nothing over its blocks against the
        current unlocked budget (``Accounting.fits``; docs/design.md §3.3); those that do not fit, or
        are no longer pending, stay as they are. Returns the granted ids."""
        ids = check.ids(pipeline_ids)
        at = check.now_or_clock(now)
        if not ids:
            return []

        def body() -> list[int]:
            listed = json.dumps(sorted(set(ids)))
            states = dict(self._sql(
                "SELECT id, state FROM pipelines WHERE id IN (SELECT value FROM json_each(?))", [listed]))
            unknown = [i for i in ids if i not in states]
            if unknown:
                raise LedgerError(f"unknown pipeline {unknown[0]}")
            edges: dict[int, list[tuple[int, bytes]]] = {i: [] for i in states}
            for pipeline_id, block_id, demand in self._sql(
                "SELECT pipeline_id, block_id, demand FROM demands WHERE pipeline_id IN (SELECT value FROM json_each(?)) "
                "ORDER BY pipeline_id, position",
                [listed],
            ):
                edges[pipeline_id].append((block_id, demand))
            moves = Moves(self.db, at)
            moves.load(b for pending in edges.values() for b, _ in pending)
            quotas = QuotaCheck.load(self.db)
            granted = []
            for pipeline_id in ids:
                if states[pipeline_id] != "pending" or not edges[pipeline_id]:
                    continue
                if self._allocate(moves, pipeline_id, edges[pipeline_id], quotas):
                    states[pipeline_id] = "granted"
                    granted.append(pipeline_id)
            self.db.conn.executemany(
                "UPDATE pipelines SET state = 'granted', granted_at = ? WHERE id = ? AND state = 'pending'",
                [(at, pipeline_id) for pipeline_id in granted],
            )
            moves.flush()
            return granted

        return self._write(body)

    def _allocate(self, moves: Moves, pipeline_id: int, edges: list[tuple[int, bytes]],
                  quotas: QuotaCheck | None = None) -> bool:
        """Allocate a pipeline's demand on every block if it fits on all of them (and
        within its team's quota, :mod:`privsched.ledger.quotas`)."""
        block_ids = [b for b, _ in edges]
        if any(moves.states[b] != "active" for b in block_ids):
            return False
        accounting = self._dataset_by_id(moves.datasets[block_ids[0]]).accounting
        demand = unpack_rows([d for _, d in edges], accounting.dims)
        unlocked = np.stack([moves.balances[b]["unlocked"] for b in block_ids])
        capacity = np.stack([moves.balances[b]["capacity"] for b in block_ids])
        if not np.all(accounting.fits(demand, unlocked, accounting.live(capacity))):
            return False
        if quotas is not None and not quotas.take(pipeline_id, moves.datasets[block_ids[0]], block_ids, demand,
                                                  capacity, accounting):
            return False
        for block_id, amount in zip(block_ids, demand):
            moves.move(block_id, "unlocked", "allocated", amount, kind="grant", pipeline_id=pipeline_id)
        moves.state_event("grant", "pending", "granted", dataset_id=moves.datasets[block_ids[0]],
                          pipeline_id=pipeline_id)
        return True

    def mark_running(self, pipeline_id: int, placement: dict, now: float | None = None,
                     launch_token: str | None = None) -> None:
        """granted → running, recording where the job runs and, with ``launch_token``, that
        its launch began (:mod:`privsched.ledger.launches`)."""
        (pipeline_id,) = check.ids([pipeline_id])
        text = check.json_text(placement, "placement")
        at = check.now_or_clock(now)

        def body() -> None:
            _, dataset_id, _ = self._pipeline_edges(pipeline_id, ("granted",), "start")
            self.db.execute("UPDATE pipelines SET state = 'running', started_at = ?, placement = ? WHERE id = ?",
                            [at, text, pipeline_id])
            moves = Moves(self.db, at)
            moves.state_event("run", "granted", "running", dataset_id=dataset_id, pipeline_id=pipeline_id)
            moves.flush()
            if launch_token is not None:
                generation = None if self._fence is None else self._fence[1]
                launches.record_launching(self.db, pipeline_id, launch_token, generation, at)

        self._write(body)

    def complete(
        self, pipeline_id: int, spent: np.ndarray | Mapping[str, np.ndarray], now: float | None = None
    ) -> None:
        """running (or granted) → completed: what the job spent (≤ its grant, per block, in
        every dimension) moves allocated → consumed, the rest allocated → unlocked."""
        (pipeline_id,) = check.ids([pipeline_id])
        at = check.now_or_clock(now)

        def body() -> None:
            state, dataset_id, edges = self._pipeline_edges(pipeline_id, HOLDING_STATES, "complete")
            accounting = self._dataset_by_id(dataset_id).accounting
            per_block = check.spent_per_block(spent, [key for _, key, _ in edges], accounting)
            moves = Moves(self.db, at)
            moves.load(b for b, _, _ in edges)
            consumed = []
            for block_id, key, demand in edges:
                used = per_block[key]
                over = ~leq(used, demand)
                if over.any():
                    labels = ", ".join(lbl for lbl, bad in zip(accounting.dimension_labels(), over) if bad)
                    raise LedgerError(f"pipeline {pipeline_id} spent more than its grant on block {key!r} at {labels}")
                used = np.minimum(used, demand)
                settle(moves, pipeline_id, block_id, demand, used, kind="complete")
                consumed.append((pack(used), pipeline_id, block_id))
            self.db.conn.executemany("UPDATE demands SET consumed = ? WHERE pipeline_id = ? AND block_id = ?",
                                     consumed)
            self._finish(moves, pipeline_id, dataset_id, state, "completed", "complete")
            moves.flush()

        self._write(body)

    def fail(self, pipeline_id: int, message: str, touched_data: bool = True, now: float | None = None) -> None:
        """→ failed. A job that touched data consumes its whole allocation (a partial model
        may already have leaked); one that did not releases it (docs/design.md §4.4)."""
        (pipeline_id,) = check.ids([pipeline_id])
        if not isinstance(message, str):
            raise LedgerError(f"failure message must be a string, got {message!r}")
        at = check.now_or_clock(now)

        def body() -> None:
            state, dataset_id, edges = self._pipeline_edges(pipeline_id, ("pending", *HOLDING_STATES), "fail")
            moves = Moves(self.db, at)
            if state in HOLDING_STATES:
                moves.load(b for b, _, _ in edges)
                consumed = []
                for block_id, _, demand in edges:
                    used = demand if touched_data else np.zeros_like(demand)
                    settle(moves, pipeline_id, block_id, demand, used, kind="fail", reason=message)
                    consumed.append((pack(used), pipeline_id, block_id))
                self.db.conn.executemany(
                    "UPDATE demands SET consumed = ? WHERE pipeline_id = ? AND block_id = ?", consumed)
            self._finish(moves, pipeline_id, dataset_id, state, "failed", "fail", message=message)
            moves.flush()

        self._write(body)

    def cancel(self, pipeline_id: int, now: float | None = None) -> None:
        """pending → cancelled; granted (job not started) → cancelled, allocation released."""
        (pipeline_id,) = check.ids([pipeline_id])
        at = check.now_or_clock(now)

        def body() -> None:
            state, dataset_id, edges = self._pipeline_edges(pipeline_id, ("pending", "granted"), "cancel")
            moves = Moves(self.db, at)
            if state == "granted":
                moves.load(b for b, _, _ in edges)
                for block_id, _, demand in edges:
                    settle(moves, pipeline_id, block_id, demand, np.zeros_like(demand), kind="cancel")
            self._finish(moves, pipeline_id, dataset_id, state, "cancelled", "cancel")
            moves.flush()

        self._write(body)

    def release(self, pipeline_id: int, reason: str, now: float | None = None) -> None:
        """Admin act: return a failed pipeline's consumed budget to unlocked, with a reason
        kept in the event log (docs/design.md §4.4)."""
        (pipeline_id,) = check.ids([pipeline_id])
        reason = check.name(reason, "release reason")
        at = check.now_or_clock(now)

        def body() -> None:
            _, dataset_id, edges = self._pipeline_edges(pipeline_id, ("failed",), "release")
            spent = dict(self._sql("SELECT block_id, consumed FROM demands WHERE pipeline_id = ?", [pipeline_id]))
            moves = Moves(self.db, at)
            moves.load(b for b, _, _ in edges)
            released = []
            for block_id, _, demand in edges:
                amount = unpack(spent[block_id]) if spent[block_id] is not None else np.zeros_like(demand)
                if np.any(amount > 0):
                    moves.move(block_id, "consumed", "unlocked", amount, kind="release", pipeline_id=pipeline_id,
                               reason=reason)
                    released.append((pack(np.zeros_like(demand)), pipeline_id, block_id))
            if not released:
                raise LedgerError(f"pipeline {pipeline_id} has no consumed budget to release")
            self.db.conn.executemany(
                "UPDATE demands SET consumed = ? WHERE pipeline_id = ? AND block_id = ?", released)
            moves.state_event("release", "failed", "failed", dataset_id=dataset_id, pipeline_id=pipeline_id,
                              reason=reason)
            moves.flush()

        self._write(body)

    def expire(self, now: float | None = None) -> list[int]:
        """Pending pipelines past their timeout → timed_out (nothing was allocated)."""
        at = check.now_or_clock(now)

        def body() -> list[int]:
            due = self._sql(
                "SELECT id, dataset_id FROM pipelines WHERE state = 'pending' AND timeout IS NOT NULL "
                "AND submitted_at + timeout <= ? ORDER BY id",
                [at],
            )
            moves = Moves(self.db, at)
            for pipeline_id, dataset_id in due:
                self._finish(moves, pipeline_id, dataset_id, "pending", "timed_out", "expire")
            moves.flush()
            return [pipeline_id for pipeline_id, _ in due]

        return self._write(body)

    def retire_exhausted(self, now: float | None = None) -> list[int]:
        """Active blocks whose consumed budget reaches capacity at every live dimension →
        retired (docs/design.md §4.4). Returns their ids."""
        at = check.now_or_clock(now)

        def body() -> list[int]:
            moves = Moves(self.db, at)
            moves.load(b for (b,) in self._sql("SELECT id FROM blocks WHERE state = 'active'"))
            retired = []
            for block_id, balance in moves.balances.items():
                accounting = self._dataset_by_id(moves.datasets[block_id]).accounting
                live = accounting.live(balance["capacity"])
                if np.all(leq(balance["capacity"], balance["consumed"]) | ~live):
                    retired.append(block_id)
                    moves.state_event("retire", "active", "retired", dataset_id=moves.datasets[block_id],
                                      block_id=block_id)
            self.db.conn.executemany("UPDATE blocks SET state = 'retired' WHERE id = ?", [(b,) for b in retired])
            moves.flush()
            return sorted(retired)

        return self._write(body)

    # ------------------------------------------------------------------------ views
    def pending_view(self, dataset: str) -> PendingView:
        """The pending pipelines of a dataset and the blocks they can be granted on, as the
        arrays of a policy :class:`~privsched.policies.base.Snapshot` (three queries)."""

        def body() -> PendingView:
            info = self._dataset(dataset)
            dims = info.accounting.dims
            pipelines = self._sql(
                "SELECT id, submitted_at, weight FROM pipelines WHERE dataset_id = ? AND state = 'pending' ORDER BY id",
                [info.id],
            )
            edges = self._sql(
                "SELECT e.pipeline_id, e.block_id, e.demand FROM demands e JOIN pipelines p ON p.id = e.pipeline_id "
                "WHERE p.dataset_id = ? AND p.state = 'pending' ORDER BY e.pipeline_id, e.position",
                [info.id],
            )
            wanted = sorted({block_id for _, block_id, _ in edges})
            blocks = self._sql(
                "SELECT b.id, bal.capacity, bal.unlocked FROM blocks b JOIN balances bal ON bal.block_id = b.id "
                "WHERE b.dataset_id = ? AND (b.state = 'active' OR b.id IN (SELECT value FROM json_each(?))) "
                "ORDER BY b.id",
                [info.id, json.dumps(wanted)],
            )
            block_index = {row[0]: i for i, row in enumerate(blocks)}
            pipeline_index = {row[0]: i for i, row in enumerate(pipelines)}
            return PendingView(
                block_ids=np.array([row[0] for row in blocks], dtype=np.int64),
                capacity=unpack_rows([row[1] for row in blocks], dims),
                unlocked=unpack_rows([row[2] for row in blocks], dims),
                pipeline_ids=np.array([row[0] for row in pipelines], dtype=np.int64),
                arrival=np.array([row[1] for row in pipelines], dtype=float),
                weight=np.array([row[2] for row in pipelines], dtype=float),
                edge_pipeline=np.array([pipeline_index[row[0]] for row in edges], dtype=np.int64),
                edge_block=np.array([block_index[row[1]] for row in edges], dtype=np.int64),
                edge_demand=unpack_rows([row[2] for row in edges], dims),
                accounting=info.accounting,
            )

        return self._read(body)

    def events(self, pipeline_id: int | None = None, block_id: int | None = None) -> list[Event]:
        """The event log, oldest first, optionally only one pipeline's or one block's rows."""
        where, params = ["1"], []
        if pipeline_id is not None:
            where.append("pipeline_id = ?")
            params += check.ids([pipeline_id])
        if block_id is not None:
            where.append("block_id = ?")
            params += check.ids([block_id], "block id")
        found = self._read(lambda: self._sql(
            f"SELECT {rows.EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY id", params))
        return [rows.event(row) for row in found]

    # ------------------------------------------------------------------------ lease
    def acquire_lease(self, holder: str, ttl: float, now: float | None = None) -> bool:
        """Take the scheduler lease if it is free, expired, already ours, or held by a dead
        process of this host. Exactly one scheduler per database: from now on every write
        of this ledger is fenced with the lease's new generation (see the lease module)."""
        holder = check.name(holder, "lease holder")
        ttl = check.finite_number(ttl, "lease ttl", low_open=True)
        at = check.now_or_clock(now)

        def body() -> int | None:
            if not lease.is_free(lease.current(self.db), holder, at):
                return None
            return lease.take(self.db, holder, ttl, at)

        generation = self._lease_write(body)
        if generation is not None:
            self._fence = (holder, generation)
        return generation is not None

    def renew_lease(self, holder: str, ttl: float, now: float | None = None) -> bool:
        """Extend our lease; False if somebody else holds it now."""
        holder = check.name(holder, "lease holder")
        ttl = check.finite_number(ttl, "lease ttl", low_open=True)
        at = check.now_or_clock(now)
        return self._lease_write(lambda: lease.renew(self.db, holder, ttl, at))

    def release_lease(self, holder: str) -> None:
        self._lease_write(lambda: lease.drop(self.db, holder))
        if self._fence is not None and self._fence[0] == holder:
            self._fence = None

    def lease_holder(self, now: float | None = None) -> dict | None:
        """The current, unexpired lease (holder, pid, host, acquired_at, expires_at), or None."""
        at = check.now_or_clock(now)
        row = self._read(lambda: lease.current(self.db))
        return row if row is not None and row["expires_at"] > at else None

    # --------------------------------------------------------------------- launches
    def record_started(self, pipeline_id: int, token: str, pid: int | None = None,
                       start_ticks: str | None = None, now: float | None = None) -> None:
        """A running pipeline's job process exists (launching → started)."""
        (pipeline_id,) = check.ids([pipeline_id])
        at = check.now_or_clock(now)

        def body() -> None:
            if not launches.record_started(self.db, pipeline_id, token, pid, start_ticks, at):
                raise LedgerError(f"pipeline {pipeline_id} has no launch {token!r}")

        self._write(body)

    def launch_records(self, pipeline_ids: Sequence[int]) -> dict[int, launches.LaunchRecord]:
        """The launch records of these pipelines (those that have one)."""
        ids = check.ids(pipeline_ids)
        return self._read(lambda: launches.read(self.db, ids))

    # ------------------------------------------------------------------------ audit
    def audit(self, expect: str | None = None) -> AuditReport:
        """Verify the event log's hash chain (and, with ``expect``, that it still holds that
        chain head, ``<event id>:<hex SHA-256>`` from an earlier report's ``head``); rebuild
        datasets, blocks, pipelines, demands and every balance from the events and compare;
        check the identity and the safety invariant of every block, and every pipeline's
        holdings."""
        if expect is not None:
            try:
                parse_head(expect)
            except ValueError as exc:
                raise LedgerError(str(exc)) from exc
        return self._read(lambda: audit_database(self.db, expect))

    # ---------------------------------------------------------------------- changes
    def changes(self, since: int | None = None) -> Changes | None:
        """What changed after event ``since`` (None: everything), or None when the event log
        shows a gap there (:mod:`privsched.ledger.changes`)."""
        return self._read(lambda: read_changes(self.db, since))
