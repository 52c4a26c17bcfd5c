"""The budget ledger: the single source of truth, and the only place budget moves.

Every public method that moves budget or changes state is one ``BEGIN IMMEDIATE``
transaction that makes all its checks inside the transaction and appends to the ``events``
log, from which every balance can be recomputed (:meth:`Ledger.audit`). Errors a caller can
cause raise :class:`LedgerError` and change nothing (docs/design.md §6; life cycle: docs/design.md §4.4).

:class:`Ledger` is the façade: it checks a caller's arguments, then runs one transition as
one transaction (:mod:`~privsched.ledger.transaction`); the transitions themselves are plain
functions in :mod:`~privsched.ledger.catalog` (datasets, blocks, unlocking) and
:mod:`~privsched.ledger.lifecycle` (a pipeline's life cycle), and the queries are a
:class:`~privsched.ledger.reads.Reader`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from privsched.ledger import launches, lease
from privsched.ledger import validation as check
from privsched.ledger.chain import parse_head
from privsched.ledger.connection import locked, open_database
from privsched.ledger.errors import LedgerError
from privsched.ledger.models import (
    OPERATOR,
    PIPELINE_STATES,
    SCHEDULER,
    AuditReport,
    BlockInfo,
    BlockSpec,
    DatasetInfo,
    DatasetSchema,
    Ending,
    Event,
    PendingView,
    PipelineInfo,
    PipelineRequest,
    Segment,
)
from privsched.ledger.reads import Reader

if TYPE_CHECKING:
    import numpy as np

    from privsched.ledger.changes import Changes
    from privsched.ledger.quotas import TeamQuotas
    from privsched.ledger.database import Database

T = TypeVar("T")


class Ledger:
    """Privacy budget accounts of datasets, blocks and pipelines in one SQLite file.

    Safe to open from many processes at once; one instance may be shared by threads
    (its transactions are serialised). Every event records who caused it: the ``actor``
    a write method is given (a server passes its authenticated user's name), else
    :data:`SCHEDULER` while this ledger holds the scheduler lease, else the ledger's own
    ``actor`` (:data:`OPERATOR`, whoever opened the file)."""

    def __init__(self, path: str | os.PathLike, *, create: bool = False, actor: str = OPERATOR) -> None:
        self.path = Path(path)
        self.actor = check.name(actor, "actor")
        self.db = open_database(self.path, create=create)
        self._reader = Reader(self.db)  # its queries, and the datasets it has read
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
    def _write(self, step: Callable[..., T], *args: Any, now: float | None = None, actor: str | None = None) -> T:
        """``step(tx, *args)`` (a transition of :mod:`~privsched.ledger.lifecycle` or
        :mod:`~privsched.ledger.catalog`) as one write transaction at ``now``, caused by
        ``actor``; while this ledger holds the scheduler lease, it first checks, inside the
        transaction, that the lease was not taken over since (:mod:`~privsched.ledger.transaction`)."""
        from privsched.ledger import transaction

        who = check.name(actor, "actor") if actor is not None else None
        at = check.now_or_clock(now)
        with self._lock:
            fence = self._fence
            default = SCHEDULER if fence is not None else self.actor
            return transaction.write(self._lock, self._reader, fence, at, who or default, step, *args)

    def _lease_write(self, step: Callable[..., T], *args: Any) -> T:
        """``step(db, *args)`` as one write transaction that the lease's fence does not guard
        (taking, renewing and dropping the lease itself)."""
        return locked(self._lock, self.db, step, self.db, *args)

    def _read(self, body: Callable[..., T], *args: Any) -> T:
        """``body(*args)`` in one read transaction: a consistent view across its queries."""
        return locked(self._lock, self.db, body, *args, immediate=False)

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
        *,
        actor: str | None = None,
        unit: str = "record",
        user_column: str | None = None,
        max_rows_per_user: int | None = None,
    ) -> DatasetInfo:
        """Register a dataset with its global guarantee (ε_G, δ_G) and accounting mode; every
        block of it gets capacity ε_G, or the curve ε_G(α) of docs/design.md §3.2 under RDP.
        ``unit``: what a block's budget protects (docs/privacy.md "Units"), a record, or a
        person named by ``user_column`` with at most ``max_rows_per_user`` rows in any read."""
        from privsched.budgets.capacity import CONVERSIONS, block_capacity, validate_epsilon_delta
        from privsched.ledger import catalog

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
                f"no RDP order has positive capacity at epsilon={epsilon:g}, delta={delta:g}: raise epsilon or delta, or add larger orders"
            )
        person = check.unit(unit, user_column, max_rows_per_user)
        return self._write(
            catalog.create_dataset, name, mode, float(epsilon), float(delta), conversion, capacity, person, now=now, actor=actor
        )

    def get_dataset(self, name: str) -> DatasetInfo:
        return self._read(self._reader.dataset, name)

    def list_datasets(self) -> list[DatasetInfo]:
        return self._read(self._reader.datasets)

    # ----------------------------------------------------------------------- blocks
    def add_blocks(
        self,
        dataset: str,
        blocks: Sequence[BlockSpec | str],
        unlocked_fraction: float = 0.0,
        now: float | None = None,
        *,
        actor: str | None = None,
        schema: DatasetSchema | None = None,
    ) -> list[BlockInfo]:
        """Add blocks with the dataset's capacity, all locked except ``unlocked_fraction``.
        A block's location must be a file or folder this process can read (recorded as an
        absolute path, with the SHA-256 of its content unless the spec carries the one
        privsched took when it wrote the file); a block may have none, and then a built-in
        job granted it fails before it starts, at no cost (the scheduler's preflight). Content
        already registered in any dataset is refused. ``schema``: the imported table's, checked
        against the dataset's (recorded by its first import)."""
        from privsched.ledger.fingerprints import fingerprint
        from privsched.ledger import catalog

        given = [BlockSpec(b) if isinstance(b, str) else b for b in blocks]
        if not given:
            raise LedgerError("no blocks to add")
        specs = []
        for spec in given:
            if not isinstance(spec, BlockSpec):
                raise LedgerError(f"expected a BlockSpec or a key, got {spec!r}")
            check.name(spec.key, "block key")
            if spec.location is not None and not isinstance(spec.location, str):
                raise LedgerError(f"block location must be a string, got {spec.location!r}")
            if spec.location is not None:
                where = check.location(spec.location, spec.key)
                spec = BlockSpec(spec.key, where, spec.sha256 or fingerprint(where, spec.key), spec.rows)
            specs.append(spec)
        keys = check.unique((s.key for s in specs), "block key")
        fraction = check.finite_number(unlocked_fraction, "unlocked fraction", high=1.0)
        unit = self.get_dataset(dataset).unit
        if unit != "record":
            raise LedgerError(f"dataset {dataset!r} is a {unit}-unit dataset: only `blocks import` makes its blocks, placing each person")
        return self._write(catalog.add_blocks, dataset, specs, keys, fraction, schema, now=now, actor=actor)

    def add_segments(
        self,
        dataset: str,
        segments: list[Segment],
        partitions: int,
        schema: DatasetSchema,
        unlocked_fraction: float = 0.0,
        *,
        actor: str | None = None,
    ) -> list[BlockInfo]:
        """Register an import into a user-unit dataset in one transaction: each segment
        creates or grows its user block (:func:`~privsched.ledger.catalog.add_segments`)."""
        from privsched.ledger import catalog

        fraction = check.finite_number(unlocked_fraction, "unlocked fraction", high=1.0)
        return self._write(catalog.add_segments, dataset, segments, fraction, schema, partitions, actor=actor)

    def segment_counts(self, dataset: str) -> dict[str, int]:
        """How many segments each user block of ``dataset`` holds, by key."""
        from privsched.ledger import catalog

        return self._write(catalog.segment_counts, dataset)

    def user_partitions(self, dataset: str) -> int | None:
        """A user-unit dataset's P partitions, fixed by its first import (None before)."""
        from privsched.ledger import catalog

        return self._write(catalog.user_partitions, dataset)

    def user_key(self) -> bytes:
        """The database's secret key placing people in user partitions (created once)."""
        from privsched.ledger import catalog

        return self._write(catalog.user_key)

    def dataset_schema(self, dataset: str) -> DatasetSchema | None:
        """The dataset's table schema and declarations (None until its first import)."""
        return self._read(self._reader.dataset_schema, dataset)

    def list_blocks(self, dataset: str | None = None, *, active_only: bool = False) -> list[BlockInfo]:
        return self._read(self._reader.dataset_blocks, dataset, active_only)

    def get_block(self, dataset: str, key: str) -> BlockInfo:
        return self._read(self._reader.block, dataset, key)

    # -------------------------------------------------------------------- pipelines
    def submit(self, request: PipelineRequest, now: float | None = None, *, actor: str | None = None) -> int:
        """Record a pending pipeline; reject it (nothing written) if it is malformed or can
        never be granted (docs/design.md §4.4)."""
        return self.submit_many([request], now, actor=actor)[0]

    def submit_many(
        self,
        requests: Sequence[PipelineRequest],
        now: float | None = None,
        *,
        claim: Callable[[list[int]], None] | None = None,
        actor: str | Sequence[str] | None = None,
    ) -> list[int]:
        """Submit several pipelines in one transaction: all are recorded, or none.

        ``claim(ids)`` runs inside that transaction once the pipelines are inserted (on
        this ledger's connection): what it writes commits with them, and if it raises,
        nothing is recorded (e.g. who submitted them, under which submission id).
        ``actor``: who submits them all, or one actor per request."""
        from privsched.ledger import lifecycle

        requests = list(requests)
        if actor is None or isinstance(actor, str):
            return self._write(lifecycle.submit_many, requests, None, claim, now=now, actor=actor)
        actors = [check.name(a, "actor") for a in actor]
        if len(actors) != len(requests):
            raise LedgerError(f"{len(actors)} actors for {len(requests)} submissions")
        return self._write(lifecycle.submit_many, requests, actors, claim, now=now)

    def get_pipeline(self, pipeline_id: int) -> PipelineInfo:
        (pipeline_id,) = check.ids([pipeline_id])
        return self._read(self._reader.pipeline, pipeline_id)

    def list_pipelines(self, states: Iterable[str] | None = None, dataset: str | None = None) -> list[PipelineInfo]:
        wanted = None if states is None else [states] if isinstance(states, str) else list(states)
        for state in wanted or []:
            if state not in PIPELINE_STATES:
                raise LedgerError(f"unknown pipeline state {state!r} (expected one of {', '.join(PIPELINE_STATES)})")
        return self._read(self._reader.pipelines_in, wanted, dataset)

    def released_statistics(self, dataset: str, mechanism: str | None) -> list[PipelineInfo]:
        """Completed built-in statistics of ``dataset`` charged for ``mechanism``, not
        themselves reuses, in id order (:mod:`privsched.ledger.reuse`)."""
        return self._read(self._reader.released_statistics, dataset, mechanism)

    # ----------------------------------------------------------------- budget moves
    def unlock(self, fractions: Mapping[int, float], now: float | None = None, *, actor: str | None = None) -> None:
        """Unlock ``fraction × capacity`` of each block at every dimension, capped at what is
        still locked (docs/design.md §4.1)."""
        from privsched.ledger import catalog

        wanted = {}
        for block_id, fraction in dict(fractions).items():
            (block_id,) = check.ids([block_id], "block id")
            wanted[block_id] = check.finite_number(fraction, f"unlock fraction of block {block_id}")
        self._write(catalog.unlock, wanted, now=now, actor=actor)

    def raise_unlocked(self, targets: Mapping[int, float], now: float | None = None, *, actor: str | None = None) -> None:
        """Raise each block's unlocked share to ``target`` (in [0, 1]) of its capacity: the
        scheduler's unlock, in exact quanta and independent of the steps taken
        (:func:`~privsched.budgets.exact.raised`; docs/design.md §4.1)."""
        from privsched.ledger import catalog

        wanted = {}
        for block_id, target in dict(targets).items():
            (block_id,) = check.ids([block_id], "block id")
            wanted[block_id] = check.finite_number(target, f"unlock target of block {block_id}")
        self._write(catalog.raise_unlocked, wanted, now=now, actor=actor)

    def grant(self, pipeline_ids: Sequence[int], now: float | None = None, fractions: Mapping[int, float] | None = None) -> list[int]:
        """Grant pipelines in the given order, each all-or-nothing over its blocks against the
        current unlocked budget (``Accounting.fits``; docs/design.md §3.3); those that do not fit, or
        are no longer pending, stay as they are. ``fractions``: by pipeline id, the fraction
        of its demand an elastic pipeline is granted, within [its ``elastic_min``, 1] (default
        1, the whole demand; docs/design.md §10). Returns the granted ids."""
        from privsched.ledger import lifecycle

        ids = check.ids(pipeline_ids)
        check.now_or_clock(now)
        if not ids:
            return []
        shares = None
        if fractions is not None:
            shares = {int(i): check.finite_number(f, "fraction", high=1.0, low_open=True) for i, f in fractions.items()}
        return self._write(lifecycle.grant, ids, shares, now=now)

    def mark_running(self, pipeline_id: int, placement: dict, now: float | None = None, launch_token: str | None = None) -> None:
        """granted → running, recording where the job runs and, with ``launch_token``, that
        its launch began (:mod:`privsched.ledger.launches`)."""
        from privsched.ledger import lifecycle

        (pipeline_id,) = check.ids([pipeline_id])
        text = check.json_text(placement, "placement")
        self._write(lifecycle.mark_running, pipeline_id, text, launch_token, now=now)

    def complete(self, pipeline_id: int, spent: np.ndarray | Mapping[str, np.ndarray], now: float | None = None) -> None:
        """running (or granted) → completed: what the job spent (≤ its grant, per block, in
        every dimension) moves allocated → consumed, the rest allocated → unlocked."""
        from privsched.ledger import lifecycle

        (pipeline_id,) = check.ids([pipeline_id])
        self._write(lifecycle.complete, pipeline_id, spent, now=now)

    def fail(
        self, pipeline_id: int, message: str, touched_data: bool = True, now: float | None = None, *, actor: str | None = None
    ) -> None:
        """→ failed. A job that touched data consumes its whole allocation (a partial model
        may already have leaked); one that did not releases it (docs/design.md §4.4)."""
        from privsched.ledger import lifecycle

        (pipeline_id,) = check.ids([pipeline_id])
        self._write(lifecycle.fail, pipeline_id, check.failure_message(message), touched_data, now=now, actor=actor)

    def settle_many(self, endings: Sequence[Ending], now: float | None = None) -> None:
        """Settle several ended jobs in one transaction (one disk sync), all or none: each
        completes with what it spent, as :meth:`complete`, or fails, as :meth:`fail`. If the
        ledger refuses one (a spending above its grant, a pipeline already settled), nothing
        is recorded and :class:`LedgerError` names it."""
        from privsched.ledger import lifecycle

        checked = []
        for ending in endings:
            if not isinstance(ending, Ending):
                raise LedgerError(f"expected an Ending, got {ending!r}")
            (pipeline_id,) = check.ids([ending.pipeline_id])
            message = check.failure_message(ending.message)
            actor = None if ending.actor is None else check.name(ending.actor, "actor")
            checked.append(Ending(pipeline_id, ending.spent, message, bool(ending.touched_data), actor))
        if checked:
            self._write(lifecycle.settle_many, checked, now=now)

    def cancel(self, pipeline_id: int, now: float | None = None, *, actor: str | None = None) -> None:
        """pending → cancelled; granted (job not started) → cancelled, allocation released."""
        from privsched.ledger import lifecycle

        (pipeline_id,) = check.ids([pipeline_id])
        self._write(lifecycle.cancel, pipeline_id, now=now, actor=actor)

    def request_stop(self, pipeline_id: int, now: float | None = None, *, actor: str | None = None) -> None:
        """Record that ``actor`` asked to cancel running pipeline ``pipeline_id`` (a ``stop``
        event); the scheduler stops its job and fails it in that actor's name."""
        from privsched.ledger import lifecycle

        (pipeline_id,) = check.ids([pipeline_id])
        self._write(lifecycle.request_stop, pipeline_id, now=now, actor=actor)

    def release(self, pipeline_id: int, reason: str, now: float | None = None, *, actor: str | None = None) -> None:
        """Admin act: return a failed pipeline's consumed budget to unlocked, with a reason
        kept in the event log (docs/design.md §4.4)."""
        from privsched.ledger import lifecycle

        (pipeline_id,) = check.ids([pipeline_id])
        reason = check.name(reason, "release reason")
        self._write(lifecycle.release, pipeline_id, reason, now=now, actor=actor)

    def expire(self, now: float | None = None) -> list[int]:
        """Pending pipelines past their timeout → timed_out (nothing was allocated)."""
        from privsched.ledger import lifecycle

        return self._write(lifecycle.expire, now=now)

    def retire_exhausted(self, now: float | None = None) -> list[int]:
        """Active blocks whose consumed budget reaches capacity at every live dimension →
        retired (docs/design.md §4.4). Returns their ids."""
        from privsched.ledger import catalog

        return self._write(catalog.retire_exhausted, now=now)

    # ------------------------------------------------------------------------ views
    def pending_view(self, dataset: str) -> PendingView:
        """The pending pipelines of a dataset and the blocks they can be granted on, by
        database id (:func:`privsched.service.snapshot.snapshot_of` makes it a policy's
        snapshot)."""
        return self._read(self._reader.pending_view, dataset)

    def team_quotas(self, dataset_id: int, pipeline_ids: Sequence[int]) -> TeamQuotas | None:
        """The team quotas the pending ``pipeline_ids`` of a dataset meet and what their
        teams hold (:mod:`privsched.ledger.quotas`); None when none is under a quota."""
        from privsched.ledger.quotas import QuotaCheck

        def read() -> TeamQuotas | None:
            quotas = QuotaCheck.load(self.db)
            return None if quotas is None else quotas.of_pipelines(int(dataset_id), [int(i) for i in pipeline_ids])

        return self._read(read)

    def events(self, pipeline_id: int | None = None, block_id: int | None = None) -> list[Event]:
        """The event log, oldest first, optionally only one pipeline's or one block's rows."""
        where, params = ["1"], []
        if pipeline_id is not None:
            where.append("pipeline_id = ?")
            params += check.ids([pipeline_id])
        if block_id is not None:
            where.append("block_id = ?")
            params += check.ids([block_id], "block id")
        return self._read(self._reader.events, where, params)

    # ------------------------------------------------------------------------ lease
    def acquire_lease(self, holder: str, ttl: float, now: float | None = None) -> bool:
        """Take the scheduler lease if it is free, expired, already ours, or held by a dead
        process of this host. Exactly one scheduler per database: from now on every write
        of this ledger is fenced with the lease's new generation (see the lease module)."""
        holder = check.name(holder, "lease holder")
        ttl = check.finite_number(ttl, "lease ttl", low_open=True)
        at = check.now_or_clock(now)

        generation = self._lease_write(_take_lease, holder, ttl, at)
        if generation is not None:
            self._fence = (holder, generation)
        return generation is not None

    def renew_lease(self, holder: str, ttl: float, now: float | None = None) -> bool:
        """Extend our lease; False if somebody else holds it now."""
        holder = check.name(holder, "lease holder")
        ttl = check.finite_number(ttl, "lease ttl", low_open=True)
        at = check.now_or_clock(now)
        return self._lease_write(lease.renew, holder, ttl, at)

    def release_lease(self, holder: str) -> None:
        self._lease_write(lease.drop, holder)
        if self._fence is not None and self._fence[0] == holder:
            self._fence = None

    def lease_holder(self, now: float | None = None) -> dict | None:
        """The current, unexpired lease (holder, pid, host, acquired_at, expires_at), or None."""
        at = check.now_or_clock(now)
        row = self._read(lease.current, self.db)
        return row if row is not None and row["expires_at"] > at else None

    # --------------------------------------------------------------------- launches
    def record_started(
        self, pipeline_id: int, token: str, pid: int | None = None, start_ticks: str | None = None, now: float | None = None
    ) -> None:
        """A running pipeline's job process exists (launching → started)."""
        from privsched.ledger import lifecycle

        (pipeline_id,) = check.ids([pipeline_id])
        self._write(lifecycle.record_started, pipeline_id, token, pid, start_ticks, now=now)

    def launch_records(self, pipeline_ids: Sequence[int]) -> dict[int, launches.LaunchRecord]:
        """The launch records of these pipelines (those that have one)."""
        ids = check.ids(pipeline_ids)
        return self._read(launches.read, self.db, ids)

    # ------------------------------------------------------------------------ audit
    def audit(self, expect: str | None = None) -> AuditReport:
        """Verify the event log's hash chain (and, with ``expect``, that it still holds that
        chain head, ``<event id>:<hex SHA-256>`` from an earlier report's ``head``); rebuild
        datasets, blocks, pipelines, demands and every balance from the events and compare;
        check the identity and the safety invariant of every block, and every pipeline's
        holdings."""
        from privsched.ledger.audit import audit_database

        if expect is not None:
            try:
                parse_head(expect)
            except ValueError as exc:
                raise LedgerError(str(exc)) from exc
        return self._read(audit_database, self.db, expect)

    # ---------------------------------------------------------------------- changes
    def changes(self, since: int | None = None) -> Changes | None:
        """What changed after event ``since`` (None: everything), or None when the event log
        shows a gap there (:mod:`privsched.ledger.changes`)."""
        from privsched.ledger.changes import read_changes

        return self._read(read_changes, self.db, since)


def _take_lease(db: Database, holder: str, ttl: float, at: float) -> int | None:
    """The lease's new generation if it could be taken (:func:`lease.is_free`), else None."""
    if not lease.is_free(lease.current(db), holder, at):
        return None
    return lease.take(db, holder, ttl, at)
