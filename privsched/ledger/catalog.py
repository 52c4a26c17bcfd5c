"""Transitions of datasets and blocks: create them, unlock their budget, retire them.

Each is a plain function over a :class:`~privsched.ledger.transaction.Transaction`, run by
the façade as one write transaction; its arguments were checked before the transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from privsched.budgets.accounting import Accounting, leq
from privsched.ledger.errors import LedgerError
from privsched.ledger.models import BlockInfo, BlockSpec, DatasetInfo
from privsched.ledger.moves import detail_text
from privsched.ledger.schema import pack
from privsched.ledger.transaction import Transaction


def create_dataset(
    tx: Transaction, name: str, mode: Accounting, epsilon: float, delta: float, conversion: str, capacity: np.ndarray
) -> DatasetInfo:
    """Record a dataset and the event that defines it (docs/design.md §3.2)."""
    if tx.sql("SELECT 1 FROM datasets WHERE name = ?", [name]):
        raise LedgerError(f"dataset {name!r} already exists")
    cursor = tx.db.execute(
        "INSERT INTO datasets (name, accounting, alphas, epsilon, delta, conversion, capacity, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [name, mode.name, json.dumps(list(mode.alphas)), epsilon, delta, conversion, pack(capacity), tx.at],
    )
    dataset_id = int(cursor.lastrowid or 0)  # set by the INSERT
    definition = {
        "name": name,
        "accounting": mode.name,
        "alphas": list(mode.alphas),
        "epsilon": epsilon,
        "delta": delta,
        "conversion": conversion,
        "capacity": capacity.tolist(),
    }
    tx.moves.state_event("create", None, "created", dataset_id=dataset_id, reason=f"dataset {name}", detail=detail_text(definition))
    return tx.read.dataset_by_id(dataset_id)


def add_blocks(tx: Transaction, dataset: str, specs: list[BlockSpec], keys: list[str], fraction: float) -> list[BlockInfo]:
    """Insert blocks with the dataset's capacity, locked but for ``fraction`` of it."""
    info = tx.read.dataset(dataset)
    taken = tx.sql("SELECT key FROM blocks WHERE dataset_id = ? AND key IN (SELECT value FROM json_each(?))", [info.id, json.dumps(keys)])
    if taken:
        raise LedgerError(f"block {taken[0][0]!r} already exists in dataset {dataset!r}")
    tx.db.conn.executemany(
        "INSERT INTO blocks (dataset_id, key, location, state, created_at) VALUES (?, ?, ?, 'active', ?)",
        [(info.id, s.key, s.location, tx.at) for s in specs],
    )
    ids = dict(
        tx.sql("SELECT key, id FROM blocks WHERE dataset_id = ? AND key IN (SELECT value FROM json_each(?))", [info.id, json.dumps(keys)])
    )
    zero = pack(np.zeros_like(info.capacity))
    tx.db.conn.executemany(
        "INSERT INTO balances (block_id, capacity, locked, unlocked, allocated, consumed) VALUES (?, ?, ?, ?, ?, ?)",
        [(ids[k], pack(info.capacity), zero, zero, zero, zero) for k in keys],
    )
    locations = {s.key: s.location for s in specs}
    for key in keys:
        tx.moves.add_block(ids[key], info.id, info.capacity, key, locations[key])
        if fraction > 0:
            tx.moves.move(ids[key], "locked", "unlocked", info.capacity * fraction, kind="unlock")
    tx.moves.flush()  # the balances read back below
    return tx.read.blocks("b.id IN (SELECT value FROM json_each(?))", [json.dumps(list(ids.values()))])


def unlock(tx: Transaction, wanted: dict[int, float]) -> None:
    """Unlock ``fraction × capacity`` of each block, capped at what it still has locked
    (docs/design.md §4.1)."""
    _unlock_each(tx, wanted, lambda balance, fraction: np.maximum(np.minimum(balance["locked"], balance["capacity"] * fraction), 0.0))


def raise_unlocked(tx: Transaction, targets: dict[int, float]) -> None:
    """Raise each block's unlocked share to its target (:func:`~privsched.budgets.exact.raised`)."""
    from privsched.budgets.exact import raised

    _unlock_each(tx, targets, lambda balance, target: raised(balance["capacity"][None], balance["locked"][None], np.array([target]))[0])


def _unlock_each(tx: Transaction, wanted: dict[int, float], amount_of: Callable[[dict, float], np.ndarray]) -> None:
    """Move ``amount_of(balance, x)`` of each block in ``wanted`` (block id → x) from locked to unlocked."""
    moves = tx.moves
    moves.load(wanted)
    for block_id, x in wanted.items():
        if block_id not in moves.balances:
            raise LedgerError(f"unknown block id {block_id}")
        amount = amount_of(moves.balances[block_id], x)
        if np.any(amount > 0):
            moves.move(block_id, "locked", "unlocked", amount, kind="unlock")


def retire_exhausted(tx: Transaction) -> list[int]:
    """Active blocks consumed up to capacity at every live dimension → retired
    (docs/design.md §4.4); their ids."""
    moves = tx.moves
    moves.load(b for (b,) in tx.sql("SELECT id FROM blocks WHERE state = 'active'"))
    retired = []
    for block_id, balance in moves.balances.items():
        accounting = tx.read.dataset_by_id(moves.datasets[block_id]).accounting
        live = accounting.live(balance["capacity"])
        if np.all(leq(balance["capacity"], balance["consumed"]) | ~live):
            retired.append(block_id)
            moves.state_event("retire", "active", "retired", dataset_id=moves.datasets[block_id], block_id=block_id)
    tx.db.conn.executemany("UPDATE blocks SET state = 'retired' WHERE id = ?", [(b,) for b in retired])
    return sorted(retired)
