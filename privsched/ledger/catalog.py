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
from privsched.ledger.models import EMPTY_SHA256, BlockInfo, BlockSpec, DatasetInfo, DatasetSchema, Segment
from privsched.ledger.moves import detail_text
from privsched.ledger.schema import pack
from privsched.ledger.transaction import Transaction


def create_dataset(
    tx: Transaction,
    name: str,
    mode: Accounting,
    epsilon: float,
    delta: float,
    conversion: str,
    capacity: np.ndarray,
    unit: tuple[str, str | None, int] = ("record", None, 1),
) -> DatasetInfo:
    """Record a dataset and the event that defines it (docs/design.md §3.2), with its unit of
    privacy ``(unit, user column, K)``, which the event records when it is a person's."""
    if tx.sql("SELECT 1 FROM datasets WHERE name = ?", [name]):
        raise LedgerError(f"dataset {name!r} already exists")
    kind, user_column, k = unit
    cursor = tx.db.execute(
        "INSERT INTO datasets (name, accounting, alphas, epsilon, delta, conversion, capacity, created_at, unit, user_column, "
        "max_rows_per_user) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [name, mode.name, json.dumps(list(mode.alphas)), epsilon, delta, conversion, pack(capacity), tx.at, kind, user_column, k],
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
    if kind != "record":
        definition |= {"unit": kind, "user_column": user_column, "max_rows_per_user": k}
        user_key(tx)  # the database's secret exists before any import places a person
    tx.moves.state_event("create", None, "created", dataset_id=dataset_id, reason=f"dataset {name}", detail=detail_text(definition))
    return tx.read.dataset_by_id(dataset_id)


def add_blocks(
    tx: Transaction, dataset: str, specs: list[BlockSpec], keys: list[str], fraction: float, schema: DatasetSchema | None = None
) -> list[BlockInfo]:
    """Insert blocks with the dataset's capacity, locked but for ``fraction`` of it. Data
    already registered (the same SHA-256, in any dataset) is refused: the same records never
    get two budgets (docs/design.md §9). With ``schema`` (an import), the table must have the
    dataset's schema, which the first import records."""
    info = tx.read.dataset(dataset)
    taken = tx.sql("SELECT key FROM blocks WHERE dataset_id = ? AND key IN (SELECT value FROM json_each(?))", [info.id, json.dumps(keys)])
    if taken:
        raise LedgerError(f"block {taken[0][0]!r} already exists in dataset {dataset!r}")
    _refuse_registered(tx, specs)
    if schema is not None:
        record_schema(tx, info.id, dataset, schema)
    tx.db.conn.executemany(
        "INSERT INTO blocks (dataset_id, key, location, state, created_at, sha256, rows) VALUES (?, ?, ?, 'active', ?, ?, ?)",
        [(info.id, s.key, s.location, tx.at, s.sha256, s.rows) for s in specs],
    )
    ids = dict(
        tx.sql("SELECT key, id FROM blocks WHERE dataset_id = ? AND key IN (SELECT value FROM json_each(?))", [info.id, json.dumps(keys)])
    )
    zero = pack(np.zeros_like(info.capacity))
    tx.db.conn.executemany(
        "INSERT INTO balances (block_id, capacity, locked, unlocked, allocated, consumed) VALUES (?, ?, ?, ?, ?, ?)",
        [(ids[k], pack(info.capacity), zero, zero, zero, zero) for k in keys],
    )
    for spec in specs:
        tx.moves.add_block(ids[spec.key], info.id, info.capacity, spec)
        if fraction > 0:
            tx.moves.move(ids[spec.key], "locked", "unlocked", info.capacity * fraction, kind="unlock")
    tx.moves.flush()  # the balances read back below
    return tx.read.blocks("b.id IN (SELECT value FROM json_each(?))", [json.dumps(list(ids.values()))])


def _refuse_registered(tx: Transaction, specs: list[BlockSpec]) -> None:
    """Refuse data whose content is already a block's, or twice among ``specs``: one line
    naming where it lives. Empty content (no records to protect) is exempt."""
    hashes = [s.sha256 for s in specs if s.sha256 is not None and s.sha256 != EMPTY_SHA256]
    _refuse_segments(tx, {h: s.key for s in specs if (h := s.sha256) is not None and h != EMPTY_SHA256})
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.sha256 in seen:
            raise LedgerError(f"blocks {seen[spec.sha256]!r} and {spec.key!r} hold the same data: the same records never get two budgets")
        if spec.sha256 is not None and spec.sha256 != EMPTY_SHA256:
            seen[spec.sha256] = spec.key
    found = tx.sql(
        "SELECT b.sha256, d.name, b.key FROM blocks b JOIN datasets d ON d.id = b.dataset_id "
        "WHERE b.sha256 IN (SELECT value FROM json_each(?)) ORDER BY b.id LIMIT 1",
        [json.dumps(hashes)],
    )
    if found:
        sha256, name, key = found[0]
        raise LedgerError(
            f"the data of block {seen[sha256]!r} is already registered as block {key!r} of dataset {name!r} "
            f"(sha256 {sha256[:16]}…): the same records never get two budgets"
        )


def _refuse_segments(tx: Transaction, hashes: dict[str, str]) -> None:
    """Refuse content (sha256 -> the new block or segment's key) already a segment of a user
    block, in any dataset."""
    found = tx.sql(
        "SELECT s.sha256, d.name, b.key FROM block_segments s JOIN blocks b ON b.id = s.block_id JOIN datasets d ON d.id = b.dataset_id "
        "WHERE s.sha256 IN (SELECT value FROM json_each(?)) LIMIT 1",
        [json.dumps(list(hashes))],
    )
    if found:
        sha256, name, key = found[0]
        raise LedgerError(
            f"the data of block {hashes[sha256]!r} is already registered in block {key!r} of dataset {name!r} "
            f"(sha256 {sha256[:16]}…): the same records never get two budgets"
        )


def add_segments(
    tx: Transaction,
    dataset: str,
    segments: list[Segment],
    fraction: float,
    schema: DatasetSchema,
    partitions: int,
) -> list[BlockInfo]:
    """Register an import into a user-unit dataset (docs/privacy.md "Units"): each segment
    joins its block, created for a key the dataset does not have yet (with the dataset's
    capacity) and grown otherwise (a ``grow`` event recording the segment's SHA-256 and rows,
    and the block's new fingerprint). The first import fixes the dataset's ``partitions``.
    Content already registered, in any dataset, is refused. Returns the blocks created."""
    info = tx.read.dataset(dataset)
    fixed = user_partitions(tx, dataset)
    if fixed is None:
        tx.db.execute("UPDATE datasets SET partitions = ? WHERE id = ?", [partitions, info.id])
    elif fixed != partitions:
        raise LedgerError(f"dataset {dataset!r} has {fixed} user partitions, fixed at its first import; got {partitions}")
    hashes = {s.sha256: s.key for s in segments}
    if len(hashes) != len(segments):
        raise LedgerError("two blocks of the import hold the same data: the same records never get two budgets")
    _refuse_segments(tx, hashes)
    _refuse_registered(tx, [BlockSpec(s.key, None, s.sha256) for s in segments])
    record_schema(tx, info.id, dataset, schema)
    existing = {key: (id_, state) for key, id_, state in tx.sql("SELECT key, id, state FROM blocks WHERE dataset_id = ?", [info.id])}
    fresh = [s for s in segments if s.key not in existing]
    added = add_blocks(tx, dataset, [BlockSpec(s.key, s.location, s.fingerprint, s.rows) for s in fresh], [s.key for s in fresh], fraction)
    ids = {key: id_ for key, (id_, _) in existing.items()} | {b.key: b.id for b in added}
    for segment in segments:
        block_id = ids[segment.key]
        tx.db.execute(
            "INSERT INTO block_segments (block_id, name, sha256, rows, created_at) VALUES (?, ?, ?, ?, ?)",
            [block_id, segment.name, segment.sha256, segment.rows, tx.at],
        )
        if segment.key in existing:
            tx.db.execute("UPDATE blocks SET sha256 = ?, rows = rows + ? WHERE id = ?", [segment.fingerprint, segment.rows, block_id])
            detail = {"key": segment.key, "segment": segment.name, "segment_sha256": segment.sha256, "rows": segment.rows}
            detail["sha256"] = segment.fingerprint
            state = existing[segment.key][1]
            tx.moves.state_event("grow", state, state, dataset_id=info.id, block_id=block_id, detail=detail_text(detail))
    return added


def user_partitions(tx: Transaction, dataset: str) -> int | None:
    """The dataset's P user partitions (None before its first import)."""
    found = tx.sql("SELECT partitions FROM datasets WHERE name = ?", [dataset])
    if not found:
        raise LedgerError(f"unknown dataset {dataset!r}")
    return found[0][0]


def segment_counts(tx: Transaction, dataset: str) -> dict[str, int]:
    """How many segments each user block of ``dataset`` holds, by key."""
    return dict(
        tx.sql(
            "SELECT b.key, COUNT(*) FROM block_segments s JOIN blocks b ON b.id = s.block_id JOIN datasets d ON d.id = b.dataset_id "
            "WHERE d.name = ? GROUP BY b.key",
            [dataset],
        )
    )


def user_key(tx: Transaction) -> bytes:
    """The database's key for placing people in user partitions (HMAC-SHA256): 32 bytes from
    the OS, created by the first call, never shown (docs/privacy.md "Units")."""
    import os

    found = tx.sql("SELECT value FROM secrets WHERE name = 'user-partitions'")
    if found:
        return bytes(found[0][0])
    key = os.urandom(32)
    tx.db.execute("INSERT INTO secrets (name, value) VALUES ('user-partitions', ?)", [key])
    return key


def record_schema(tx: Transaction, dataset_id: int, dataset: str, schema: DatasetSchema) -> None:
    """Record a dataset's schema at its first import (a ``schema`` event), or check a later
    import against it: the same columns and types, and no declaration other than the one
    recorded (a later import may leave it out)."""
    found = tx.sql("SELECT definition FROM dataset_schemas WHERE dataset_id = ?", [dataset_id])
    if found:
        known = DatasetSchema.from_dict(json.loads(found[0][0]))
        if schema.columns != known.columns:
            raise LedgerError(f"the table's columns differ from dataset {dataset!r}'s: {schema_difference(known.columns, schema.columns)}")
        for given, recorded, what in ((schema.bounds, known.bounds, "bounds"), (schema.categories, known.categories, "categories")):
            if given and given != recorded:
                raise LedgerError(f"dataset {dataset!r} already declares other {what}; declarations are fixed at its first import")
        return
    definition = detail_text(schema.to_dict())
    tx.db.execute("INSERT INTO dataset_schemas (dataset_id, definition) VALUES (?, ?)", [dataset_id, definition])
    tx.moves.state_event("schema", None, "recorded", dataset_id=dataset_id, reason=f"dataset {dataset}", detail=definition)


def schema_difference(known: dict[str, str], given: dict[str, str]) -> str:
    """The first difference between two tables' columns, in words."""
    for name, kind in known.items():
        if name not in given:
            return f"column {name!r} is missing"
        if given[name] != kind:
            return f"column {name!r} is {given[name]}, the dataset's is {kind}"
    extra = next(name for name in given if name not in known) if set(given) - set(known) else None
    if extra is not None:
        return f"column {extra!r} is not in the dataset"
    return "the columns are in another order"


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
