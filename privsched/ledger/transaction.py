"""What a life-cycle transition works with inside one write transaction.

A transition (:mod:`privsched.ledger.lifecycle`, :mod:`privsched.ledger.catalog`) is a plain
function ``step(tx, ...)``; the façade (:class:`privsched.ledger.ledger.Ledger`) runs it with
:func:`write`, the one transaction helper: ``BEGIN IMMEDIATE``, the scheduler lease's fence
checked first when the ledger holds the lease (:mod:`privsched.ledger.lease`), the step, then
every budget movement and event it made written (:class:`~privsched.ledger.moves.Moves`),
all committed together or not at all (docs/design.md §6).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from privsched.ledger.database import Database
from privsched.ledger import lease
from privsched.ledger.connection import locked
from privsched.ledger.moves import Moves
from privsched.ledger.reads import Reader

T = TypeVar("T")


@dataclass(frozen=True)
class Transaction:
    """One write transaction: its connection, its movements and events, its lookups."""

    db: Database
    moves: Moves  # the balances it touches and the events it appends
    read: Reader  # lookups on the same connection (they see this transaction's writes)
    generation: int | None  # the scheduler lease generation fencing it, if the ledger holds the lease

    @property
    def at(self) -> float:
        """The transaction's clock: every event it appends carries this time."""
        return self.moves.now

    def sql(self, sql: str, params: list | tuple = ()) -> list[tuple]:
        return self.db.execute(sql, list(params)).fetchall()


def write(
    lock: threading.RLock, read: Reader, fence: tuple[str, int] | None, at: float, actor: str, step: Callable[..., T], *args: Any
) -> T:
    """``step(tx, *args)`` as one write transaction at clock ``at``, its events caused by
    ``actor``; with a ``fence`` (holder, generation), refused unless that lease is still
    current (checked first, inside the transaction)."""

    def attempt() -> T:
        if fence is not None:
            lease.check_fence(read.db, *fence)
        tx = Transaction(read.db, Moves(read.db, at, actor), read, None if fence is None else fence[1])
        result = step(tx, *args)
        tx.moves.flush()
        return result

    return locked(lock, read.db, attempt)
