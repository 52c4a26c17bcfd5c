"""The audit: verify the event log's hash chain, recompute every balance from the log and
check the ledger's invariants.

Checks of the log itself (:mod:`privsched.ledger.history`): every row's link in the hash
chain, optionally a chain head kept earlier, and that the datasets, blocks, pipelines and
demands tables say what the events that created and moved them recorded. Then, per block
and dimension (docs/design.md §2, §3.3, §4.4):
- the stored balances equal the replay of the append-only event log;
- the identity ``capacity = locked + unlocked + allocated + consumed``;
- no negative locked, allocated or consumed budget (basic: nor unlocked);
- the safety invariant ``Accounting.is_safe(allocated + consumed, capacity)``, in exact quanta;
and per pipeline: a granted or running pipeline holds exactly its grant on each of its
blocks (its demand, or the fraction of it an elastic grant gave, within the least fraction
it accepts), every other holds nothing, and its recorded consumption matches the log. Last, each
block's data is re-hashed against the fingerprint its creation recorded.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from privsched.ledger.database import Database
from privsched.budgets.accounting import RELATIVE_TOLERANCE, Accounting
from privsched.budgets.elastic import granted_amount
from privsched.ledger.fingerprints import data_problem
from privsched.ledger.history import EVENT_SELECT, Records, check_expected_head, check_tables, verify_chain
from privsched.ledger.models import BUCKETS, HOLDING_STATES, AuditReport
from privsched.ledger.moves import ROUNDED_UP, shifted
from privsched.ledger.schema import unpack


def _close(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    bound = np.maximum.reduce([np.abs(a), np.abs(b), np.abs(scale)])
    return np.abs(a - b) <= RELATIVE_TOLERANCE * bound + 1e-300


def _nonnegative(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return x >= -RELATIVE_TOLERANCE * np.abs(scale)


def _dims(labels: list[str], mask: np.ndarray) -> str:
    return ", ".join(label for label, bad in zip(labels, mask) if bad)


class _Replay:
    """Balances and per-pipeline holdings rebuilt from the event log alone."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, np.ndarray]] = {}
        self.held: dict[tuple[int, int], np.ndarray | float] = defaultdict(lambda: 0.0)  # 0 until an event adds
        self.spent: dict[tuple[int, int], np.ndarray | float] = defaultdict(lambda: 0.0)
        #: Per block, the sum of |amount| over every move: the scale of the rounding that a
        #: bucket emptied by as many moves as filled it can carry (±ulps, never more).
        self.flows: dict[int, np.ndarray] = {}

    def apply(self, block_id: int, pipeline_id: int | None, source: str | None, target: str, amount: np.ndarray):
        balance = self.blocks.setdefault(block_id, {"capacity": np.zeros_like(amount)})
        flow = self.flows.setdefault(block_id, np.zeros_like(amount))
        # The arithmetic of Moves.move (moves.shifted: exact quanta on the grid, floats off it).
        if source is None:
            balance["capacity"] = balance["capacity"] + amount
        else:
            balance[source] = shifted(balance.get(source, 0.0), amount, up=source in ROUNDED_UP, subtract=True)
        balance[target] = shifted(balance.get(target, 0.0), amount, up=target in ROUNDED_UP, subtract=False)
        self.flows[block_id] = flow + np.abs(amount)
        if pipeline_id is None:
            return
        key = (pipeline_id, block_id)
        if target == "allocated":
            self.held[key] = shifted(self.held[key], amount, up=True, subtract=False)
        if source == "allocated":
            self.held[key] = shifted(self.held[key], amount, up=True, subtract=True)
        if target == "consumed":
            self.spent[key] = shifted(self.spent[key], amount, up=True, subtract=False)
        if source == "consumed":
            self.spent[key] = shifted(self.spent[key], amount, up=True, subtract=True)


def audit_database(db: Database, expect: str | None = None) -> AuditReport:
    """Run every check (with ``expect``, also that the log still holds that kept chain
    head); call inside a read transaction for a consistent view."""
    violations: list[str] = []
    integrity = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
    if integrity != ["ok"]:
        violations.extend(f"database file: {line}" for line in integrity)

    events = db.execute(EVENT_SELECT).fetchall()
    walked = verify_chain(events)
    violations.extend(walked.violations)
    if expect is not None:
        violations.extend(check_expected_head(walked, expect))
    records = Records()
    replay = _Replay()
    for row in events:
        records.apply(row)
        block_id, pipeline_id, source, target, amount = row[4], row[5], row[6], row[7], row[8]
        if amount is not None:
            try:
                replay.apply(block_id, pipeline_id, source, target, unpack(amount))
            except ValueError:  # a length no budget vector of the block has
                violations.append(f"event {row[0]}: its amount is not a budget vector of block id {block_id}")
    violations.extend(check_tables(db, records))

    accountings = {
        row["id"]: Accounting.from_dict({"accounting": row["accounting"], "alphas": json.loads(row["alphas"])})
        for row in db.query("SELECT id, accounting, alphas FROM datasets")
    }
    n_events = len(events)

    names: dict[int, str] = {}
    capacities: dict[int, np.ndarray] = {}
    n_blocks = 0
    for row in db.execute(
        "SELECT b.id, b.dataset_id, d.name || '/' || b.key, bal.capacity, bal.locked, bal.unlocked, "
        "bal.allocated, bal.consumed FROM blocks b JOIN datasets d ON d.id = b.dataset_id "
        "JOIN balances bal ON bal.block_id = b.id ORDER BY b.id"
    ):
        block_id, dataset_id, name, capacity, *buckets = row
        n_blocks += 1
        accounting = accountings[dataset_id]
        names[block_id] = name
        try:
            stored = {"capacity": unpack(capacity)} | {k: unpack(v) for k, v in zip(BUCKETS, buckets)}
            violations.extend(_check_block(f"block {name}", accounting, stored, replay.blocks.get(block_id), replay.flows.get(block_id)))
        except ValueError:  # a BLOB whose length is no budget vector of the dataset
            violations.append(f"block {name}: a stored balance is not a budget vector of its dataset")
            continue
        capacities[block_id] = stored["capacity"]
    for block_id in replay.blocks.keys() - names.keys():
        violations.append(f"event log moves budget of block id {block_id}, which has no balance row")

    violations.extend(_check_pipelines(db, replay, names, capacities, accountings))
    violations.extend(_check_data(db))
    violations.extend(_check_segments(db))
    return AuditReport(ok=not violations, violations=violations, blocks=n_blocks, events=n_events, head=walked.head)


def _check_data(db: Database) -> list[str]:
    """Each block's data re-hashed: name any that went missing or changed since its creation
    (its fingerprint, :mod:`privsched.ledger.fingerprints`)."""
    out = []
    for name, location, sha256 in db.execute(
        "SELECT d.name || '/' || b.key, b.location, b.sha256 FROM blocks b JOIN datasets d ON d.id = b.dataset_id "
        "WHERE b.sha256 IS NOT NULL ORDER BY b.id"
    ):
        problem = data_problem(location, sha256)
        if problem is not None:
            out.append(f"block {name}: {problem}")
    return out


def _check_segments(db: Database) -> list[str]:
    """Each user block's segment list against its row count (checked against the events)
    and its folder (whose fingerprint ``_check_data`` re-hashes): the same file names, each
    named by its SHA-256, their rows adding up to the block's."""
    out = []
    listed: dict[int, list[tuple[str, str, int]]] = {}
    for block_id, name, sha256, count in db.execute("SELECT block_id, name, sha256, rows FROM block_segments ORDER BY block_id, name"):
        listed.setdefault(block_id, []).append((name, sha256, count))
    for block_id, label, location, total in db.execute(
        "SELECT b.id, d.name || '/' || b.key, b.location, b.rows FROM blocks b JOIN datasets d ON d.id = b.dataset_id "
        "WHERE d.unit IN ('user', 'user-time') ORDER BY b.id"
    ):
        segments = listed.get(block_id, [])
        if any(not name.endswith(f"-{sha256}.parquet") for name, sha256, _ in segments):
            out.append(f"block {label}: a segment's name is not its SHA-256")
        if sum(count for _, _, count in segments) != total:
            out.append(f"block {label}: its segments' rows do not add up to its {total}")
        folder = Path(location) if location else None
        if folder is not None and folder.is_dir() and sorted(p.name for p in folder.iterdir()) != [name for name, _, _ in segments]:
            out.append(f"block {label}: its folder does not hold exactly its registered segments ({location})")
    return out


def _check_block(
    label: str,
    accounting: Accounting,
    stored: dict[str, np.ndarray],
    replayed: dict[str, np.ndarray] | None,
    flow: np.ndarray | None = None,
) -> list[str]:
    labels = accounting.dimension_labels()
    capacity = stored["capacity"]
    out: list[str] = []
    if replayed is None:
        return [f"{label}: the event log never created its capacity"]
    for bucket in ("capacity", *BUCKETS):
        again = replayed.get(bucket, np.zeros_like(capacity))
        bad = ~_close(stored[bucket], again, capacity)
        if bad.any():
            out.append(f"{label}: stored {bucket} differs from the event log at {_dims(labels, bad)}")
    total = np.sum([stored[bucket] for bucket in BUCKETS], axis=0)
    # Rounding scales with the terms summed: under RDP a dead order (capacity 0) can carry
    # negative unlocked budget that cancels its consumed budget, and a bucket that grants
    # filled and releases emptied holds ±ulps of the amounts that passed through it.
    magnitude = np.sum([np.abs(stored[bucket]) for bucket in BUCKETS], axis=0)
    if flow is not None and flow.shape == magnitude.shape:
        magnitude = magnitude + flow
    bad = ~_close(capacity, total, magnitude)
    if bad.any():
        out.append(f"{label}: capacity != locked + unlocked + allocated + consumed at {_dims(labels, bad)}")
    signed = ("locked", "allocated", "consumed") if accounting.is_rdp else BUCKETS
    for bucket in signed:
        bad = ~_nonnegative(stored[bucket], magnitude)
        if bad.any():
            out.append(f"{label}: negative {bucket} at {_dims(labels, bad)}")
    if not accounting.is_safe([stored["allocated"], stored["consumed"]], capacity):
        over = ~accounting.is_safe([stored["allocated"][:, None], stored["consumed"][:, None]], capacity[:, None])
        over &= accounting.live(capacity)
        where = _dims(labels, over) if not accounting.is_rdp else "every live order"
        out.append(f"{label}: allocated + consumed exceeds capacity at {where} (safety invariant broken)")
    return out


def _check_pipelines(
    db: Database,
    replay: _Replay,
    names: dict[int, str],
    capacities: dict[int, np.ndarray],
    accountings: dict[int, Accounting],
) -> list[str]:
    out: list[str] = []
    for pipeline_id, fraction, least in db.execute("SELECT id, fraction, elastic_min FROM pipelines WHERE fraction IS NOT NULL"):
        if not (isinstance(fraction, float) and (least or 1.0) <= fraction <= 1.0):
            out.append(f"pipeline {pipeline_id}: granted a fraction {fraction!r} of its demand outside [{least or 1.0!r}, 1]")
    for pipeline_id, dataset_id, state, block_id, demand, consumed, fraction in db.execute(
        "SELECT p.id, p.dataset_id, p.state, d.block_id, d.demand, d.consumed, p.fraction "
        "FROM pipelines p JOIN demands d ON d.pipeline_id = p.id ORDER BY p.id, d.position"
    ):
        key = (pipeline_id, block_id)
        capacity = capacities.get(block_id)
        if capacity is None:
            continue
        labels = accountings[dataset_id].dimension_labels()
        label = f"pipeline {pipeline_id} on block {names[block_id]}"
        try:
            grant = granted_amount(unpack(demand), fraction if isinstance(fraction, float) else None)
            out.extend(_check_holding(label, labels, state, grant, consumed, capacity, replay, key))
        except ValueError:  # a BLOB whose length is no budget vector of the block
            out.append(f"{label}: a stored demand or consumption is not a budget vector of the block")
    return out


def _check_holding(
    label: str,
    labels: list[str],
    state: str,
    grant: np.ndarray,
    consumed: bytes | None,
    capacity: np.ndarray,
    replay: _Replay,
    key: tuple[int, int],
) -> list[str]:
    out: list[str] = []
    expected = grant if state in HOLDING_STATES else np.zeros_like(capacity)
    held = replay.held[key] + np.zeros_like(capacity)
    bad = ~_close(held, expected, capacity)
    if bad.any():
        out.append(f"{label}: holds {held.tolist()} while {state}, expected {expected.tolist()} (at {_dims(labels, bad)})")
    recorded = unpack(consumed) if consumed is not None else np.zeros_like(capacity)
    spent = replay.spent[key] + np.zeros_like(capacity)
    bad = ~_close(spent, recorded, capacity)
    if bad.any():
        out.append(f"{label}: recorded consumption differs from the event log at {_dims(labels, bad)}")
    return out
