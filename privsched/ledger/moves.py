"""Budget movements inside one write transaction.

A :class:`Moves` loads the balances of the blocks a transaction touches, applies every
movement in memory (so later checks in the same transaction see earlier moves), records one
event per movement, and writes balances and events back with two ``executemany`` calls.
The balance arithmetic is exactly the replay the audit performs over the event log
(``source −= amount``, ``target += amount``, in event order), so the two agree bit for bit.
Each new event row is appended with its link in the hash chain (:mod:`privsched.ledger.chain`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from privsched.ledger.database import Database
from privsched.ledger import chain
from privsched.ledger.models import BUCKETS, BlockSpec
from privsched.ledger.schema import pack, unpack

if TYPE_CHECKING:
    import numpy as np

#: Buckets whose balances round up off the quantum grid (budget given out); the others
#: (locked, unlocked) round down (budget that may still be given).
ROUNDED_UP = ("allocated", "consumed")

INSERT_EVENT = f"INSERT INTO events ({', '.join(chain.COLUMNS)}, hash) VALUES ({', '.join('?' * (len(chain.COLUMNS) + 1))})"


def detail_text(fields: dict[str, Any]) -> str:
    """The canonical JSON of an event's ``detail`` (sorted keys, no spaces, no NaN; floats
    written by ``repr``, so they read back exactly)."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _optional_int(value: int | None) -> int | None:
    return None if value is None else int(value)


class Moves:
    """The working set of one transaction: balances by block id, and pending event rows,
    each recording who caused it (``actor``)."""

    def __init__(self, db: Database, now: float, actor: str) -> None:
        self.db = db
        self.now = now
        self.actor = actor  # who causes the events appended from now on
        self.balances: dict[int, dict[str, np.ndarray]] = {}
        self.states: dict[int, str] = {}
        self.datasets: dict[int, int] = {}
        self.events: list[tuple] = []
        self._dirty: set[int] = set()

    def load(self, block_ids) -> None:
        """Read the balances (and states) of these blocks, if not loaded yet."""
        missing = sorted({int(b) for b in block_ids} - self.balances.keys())
        if not missing:
            return
        rows = self.db.execute(
            "SELECT b.id, b.dataset_id, b.state, bal.capacity, bal.locked, bal.unlocked, bal.allocated, bal.consumed "
            "FROM blocks b JOIN balances bal ON bal.block_id = b.id "
            "WHERE b.id IN (SELECT value FROM json_each(?))",
            [json.dumps(missing)],
        ).fetchall()
        for block_id, dataset_id, state, capacity, *buckets in rows:
            self.balances[block_id] = {"capacity": unpack(capacity)} | {name: unpack(blob) for name, blob in zip(BUCKETS, buckets)}
            self.states[block_id] = state
            self.datasets[block_id] = dataset_id

    def move(
        self,
        block_id: int,
        source: str | None,
        target: str,
        amount: np.ndarray,
        *,
        kind: str,
        pipeline_id: int | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Move ``amount`` of a loaded block's budget from one bucket to another
        (``source`` None: ``amount`` is new capacity entering ``target``), in exact quanta
        (:mod:`privsched.budgets.exact`): the amount rounded down when it enters ``locked``
        or ``unlocked`` and up otherwise, so that rounding only ever refuses (a value on the
        grid, such as a submitted demand, moves exactly)."""
        from privsched.budgets.exact import quantize

        amount = quantize(amount, up=target in ROUNDED_UP)
        balance = self.balances[block_id]
        if source is not None:
            balance[source] = shifted(balance[source], amount, up=source in ROUNDED_UP, subtract=True)
        balance[target] = shifted(balance[target], amount, up=target in ROUNDED_UP, subtract=False)
        self._dirty.add(block_id)
        self._event(kind, self.datasets[block_id], block_id, pipeline_id, source, target, pack(amount), reason, detail)

    def add_block(self, block_id: int, dataset_id: int, capacity: np.ndarray, spec: BlockSpec) -> None:
        """Register a block just inserted with empty balances; its capacity enters ``locked``
        (the event's detail records the block's key and location, and its data's SHA-256 and
        row count when it has them)."""
        import numpy as np

        zero = np.zeros_like(capacity)
        self.balances[block_id] = {"capacity": capacity} | {name: zero for name in BUCKETS}
        self.states[block_id] = "active"
        self.datasets[block_id] = dataset_id
        fields: dict[str, Any] = {"key": spec.key, "location": spec.location}
        fields |= {name: value for name, value in (("sha256", spec.sha256), ("rows", spec.rows)) if value is not None}
        self.move(block_id, None, "locked", capacity, kind="create", detail=detail_text(fields))

    def state_event(
        self,
        kind: str,
        source: str | None,
        target: str,
        *,
        dataset_id: int | None = None,
        block_id: int | None = None,
        pipeline_id: int | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Record a state change (a pipeline's or a block's), which moves no budget."""
        self._event(kind, dataset_id, block_id, pipeline_id, source, target, None, reason, detail)

    def _event(
        self,
        kind: str,
        dataset_id: int | None,
        block_id: int | None,
        pipeline_id: int | None,
        source: str | None,
        target: str | None,
        amount: bytes | None,
        reason: str | None,
        detail: str | None,
    ) -> None:
        # Values as SQLite returns them (float time, int ids), so the audit hashes the same bytes.
        self.events.append(
            (
                float(self.now),
                kind,
                _optional_int(dataset_id),
                _optional_int(block_id),
                _optional_int(pipeline_id),
                source,
                target,
                amount,
                reason,
                detail,
                self.actor,
            )
        )

    def flush(self) -> None:
        """Write the touched balances and the new events."""
        if self._dirty:
            self.db.conn.executemany(
                "UPDATE balances SET locked = ?, unlocked = ?, allocated = ?, consumed = ? WHERE block_id = ?",
                [(*(pack(self.balances[b][name]) for name in BUCKETS), b) for b in sorted(self._dirty)],
            )
            self._dirty.clear()
        if self.events:
            last = self.db.execute("SELECT id, hash FROM events ORDER BY id DESC LIMIT 1").fetchone()
            last_id, previous = last if last is not None else (0, chain.GENESIS)
            rows = [(last_id + i, *event) for i, event in enumerate(self.events, start=1)]
            self.db.conn.executemany(INSERT_EVENT, [(*row, digest) for row, digest in zip(rows, chain.extend(previous, rows))])
            self.events = []


def shifted(balance: np.ndarray | float, amount: np.ndarray, *, up: bool, subtract: bool) -> np.ndarray:
    """``balance ± amount``: in exact quanta when both are on the quantum grid, as every
    balance of a ledger written since exact arithmetic is; in floats otherwise (a balance
    written before keeps being added as it was, so that the audit's replay, which shifts
    alike, agrees with it bit for bit)."""
    from privsched.budgets.exact import minus, on_grid, plus

    if on_grid(amount) and on_grid(balance):
        return minus(balance, amount, up=up) if subtract else plus(balance, amount, up=up)
    return balance - amount if subtract else balance + amount


def settle(
    moves: Moves,
    pipeline_id: int,
    block_id: int,
    grant: np.ndarray,
    used: np.ndarray,
    *,
    kind: str,
    reason: str | None = None,
) -> np.ndarray:
    """End an allocation: ``used`` allocated → consumed (rounded up to the quantum grid, at
    most the grant), the rest allocated → unlocked; returns what was consumed."""
    import numpy as np

    from privsched.budgets.exact import minus, quantize

    used = np.minimum(quantize(used, up=True), grant)
    if np.any(used > 0):
        moves.move(block_id, "allocated", "consumed", used, kind=kind, pipeline_id=pipeline_id, reason=reason)
    rest = minus(grant, used, up=False)
    if np.any(rest > 0):
        moves.move(block_id, "allocated", "unlocked", rest, kind=kind, pipeline_id=pipeline_id, reason=reason)
    return used
