"""Checks of the event log itself: its hash chain, and the rows rebuilt from it.

The audit (:mod:`privsched.ledger.audit`) reads every event once, in id order; this module
verifies each row's link (:mod:`privsched.ledger.chain`), optionally that the log still
holds a head kept earlier, and rebuilds from the events what the other tables must say:
each dataset's definition and capacity, each block's key, location, capacity and state,
each pipeline's submission, demands and state. Any row that differs names itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from privsched.ledger.database import Database
from privsched.ledger import chain
from privsched.ledger.schema import unpack

EVENT_SELECT = f"SELECT {', '.join(chain.COLUMNS)}, hash FROM events ORDER BY id"
#: Fields of a pipeline row that its submit event records.
SUBMITTED = ("name", "owner", "weight", "timeout", "mechanism", "job", "resources", "elastic_min")


@dataclass
class Chain:
    """The result of walking the chain: its head and every broken link."""

    head: str = chain.format_head(0, chain.GENESIS)
    hashes: dict[int, bytes] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def verify_chain(rows: list[tuple]) -> Chain:
    """Check every row's hash against its content and the previous row's stored hash, that
    ids have no gaps (a deleted row is named by the ids missing), and that once an event
    records its actor every later one does (only events older than schema 4 have none)."""
    out = Chain()
    previous, previous_id = chain.GENESIS, 0
    first_actor: int | None = None  # the first event that records its actor
    for row in rows:
        *content, digest = row
        event_id = content[0]
        if content[-1] is not None and first_actor is None:
            first_actor = event_id
        elif content[-1] is None and first_actor is not None:
            out.violations.append(
                f"event {event_id}: records no actor, but event {first_actor} before it does (an event inserted in the older format)"
            )
        if event_id != previous_id + 1:
            missing = f"{previous_id + 1}" if event_id == previous_id + 2 else f"{previous_id + 1}–{event_id - 1}"
            out.violations.append(f"event log: event {missing} missing before event {event_id} (deleted)")
        try:
            expected = chain.link(previous, content)
        except TypeError as exc:
            out.violations.append(f"event {event_id}: a column holds a value of the wrong type ({exc})")
            expected = None
        if expected != digest:
            out.violations.append(
                f"event {event_id}: hash does not match its content and the previous event "
                "(this row, or the one before it, was altered, inserted or deleted)"
            )
        out.hashes[event_id] = digest
        previous, previous_id = (digest if isinstance(digest, bytes) else b""), event_id
    if rows:
        out.head = chain.format_head(previous_id, previous)
    return out


def check_expected_head(found: Chain, expected: str) -> list[str]:
    """Whether the log still holds the kept head ``<id>:<hash>`` (history up to it unchanged)."""
    event_id, digest = chain.parse_head(expected)
    if event_id == 0:
        return [] if digest == chain.GENESIS else ["kept head: not the head of an empty log"]
    if event_id not in found.hashes:
        return [f"kept head: event {event_id} is no longer in the log (history truncated or rewritten)"]
    if found.hashes[event_id] != digest:
        return [f"kept head: event {event_id} has a different hash now (history up to it was rewritten)"]
    return []


def _detail(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text is not None else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


@dataclass
class Records:
    """What the other tables must hold, rebuilt from the events."""

    datasets: dict[int, dict[str, Any]] = field(default_factory=dict)
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)
    pipelines: dict[int, dict[str, Any]] = field(default_factory=dict)
    schemas: dict[int, tuple[int, str]] = field(default_factory=dict)  # dataset id -> (event, definition)
    violations: list[str] = field(default_factory=list)

    def apply(self, row: tuple) -> None:
        (event_id, _, kind, dataset_id, block_id, pipeline_id, source, target, amount, _, detail) = row[:11]
        if kind == "create" and block_id is None and pipeline_id is None:
            self.datasets[dataset_id] = _detail(detail) | {"event": event_id}
        elif kind == "create" and block_id is not None and amount is not None:
            self.blocks[block_id] = _detail(detail) | {
                "event": event_id,
                "dataset_id": dataset_id,
                "capacity": _floats(amount),
                "state": "active",
            }
        elif kind == "grow" and block_id in self.blocks:
            grown = _detail(detail)
            record = self.blocks[block_id]
            record["sha256"] = grown.get("sha256")
            record["rows"] = (record.get("rows") or 0) + (grown.get("rows") or 0)
        elif kind == "schema" and dataset_id is not None:
            self.schemas[dataset_id] = (event_id, detail)
        elif kind == "submit":
            self.pipelines[pipeline_id] = _detail(detail) | {"event": event_id, "dataset_id": dataset_id, "state": target}
        elif amount is None and pipeline_id is not None:
            self._transition(self.pipelines, pipeline_id, f"pipeline {pipeline_id}", event_id, source, target)
        elif amount is None and block_id is not None:
            self._transition(self.blocks, block_id, f"block id {block_id}", event_id, source, target)

    def _transition(self, table: dict, key: int, label: str, event_id: int, source: str | None, target: str | None) -> None:
        record = table.get(key)
        if record is None:
            self.violations.append(f"event {event_id}: changes the state of {label}, which no event created")
            return
        if record["state"] != source:
            self.violations.append(f"event {event_id}: moves {label} from {source}, but it was {record['state']}")
        record["state"] = target


def check_tables(db: Database, records: Records) -> list[str]:
    """Compare the datasets, blocks, pipelines and demands tables with the rebuilt records."""
    out = list(records.violations)
    seen: set[int] = set()
    for id_, name, accounting, alphas, epsilon, delta, conversion, capacity, unit, user_column, k in db.execute(
        "SELECT id, name, accounting, alphas, epsilon, delta, conversion, capacity, unit, user_column, max_rows_per_user "
        "FROM datasets ORDER BY id"
    ):
        seen.add(id_)
        logged = records.datasets.get(id_)
        if logged is None:
            out.append(f"dataset {name!r}: no event created it")
            continue
        stored = {
            "name": name,
            "accounting": accounting,
            "alphas": _json(alphas),
            "epsilon": epsilon,
            "delta": delta,
            "conversion": conversion,
            "capacity": _floats(capacity),
            "unit": unit or "record",
            "user_column": user_column,
            "max_rows_per_user": k or 1,
        }
        logged = {"unit": "record", "user_column": None, "max_rows_per_user": 1} | logged
        out.extend(
            f"dataset {name!r}: stored {key} differs from its creation (event {logged['event']})"
            for key in stored
            if stored[key] != logged.get(key)
        )
    out.extend(f"dataset id {i}: created by event {r['event']}, but its row is gone" for i, r in records.datasets.items() if i not in seen)

    seen = set()
    for id_, dataset_id, key, location, state, sha256, count in db.execute(
        "SELECT id, dataset_id, key, location, state, sha256, rows FROM blocks ORDER BY id"
    ):
        seen.add(id_)
        logged = records.blocks.get(id_)
        if logged is None:
            out.append(f"block {key!r} (id {id_}): no event created it")
            continue
        stored = {"dataset_id": dataset_id, "key": key, "location": location, "state": state, "sha256": sha256, "rows": count}
        out.extend(
            f"block {key!r} (id {id_}): stored {name} differs from the event log (event {logged['event']})"
            for name in stored
            if stored[name] != logged.get(name)
        )
        definition = records.datasets.get(logged["dataset_id"], {})
        if logged["capacity"] != definition.get("capacity"):
            out.append(f"block {key!r} (id {id_}): event {logged['event']} gave it a capacity other than its dataset's")
    out.extend(f"block id {i}: created by event {r['event']}, but its row is gone" for i, r in records.blocks.items() if i not in seen)

    stored_schemas = dict(db.execute("SELECT dataset_id, definition FROM dataset_schemas").fetchall())
    for dataset_id in sorted(stored_schemas.keys() | records.schemas.keys()):
        event, logged_schema = records.schemas.get(dataset_id, (None, None))
        if stored_schemas.get(dataset_id) != logged_schema:
            where = f"event {event}" if event is not None else "no event recorded it"
            out.append(f"dataset id {dataset_id}: its stored schema differs from the event log ({where})")
    out.extend(_check_pipelines(db, records))
    return out


def _check_pipelines(db: Database, records: Records) -> list[str]:
    out: list[str] = []
    demands: dict[int, list[list]] = {}
    for pipeline_id, block_id, position, demand in db.execute(
        "SELECT pipeline_id, block_id, position, demand FROM demands ORDER BY pipeline_id, position"
    ):
        demands.setdefault(pipeline_id, []).append([position, block_id, _floats(demand)])
    seen: set[int] = set()
    for id_, dataset_id, state, name, owner, weight, timeout, mechanism, job, resources, elastic_min in db.execute(
        "SELECT id, dataset_id, state, name, owner, weight, timeout, mechanism, job, resources, elastic_min FROM pipelines ORDER BY id"
    ):
        seen.add(id_)
        logged = records.pipelines.get(id_)
        if logged is None:
            out.append(f"pipeline {id_}: no event submitted it")
            continue
        row = (dataset_id, state, name, owner, weight, timeout, mechanism, job, resources, elastic_min)
        stored = dict(zip(("dataset_id", "state", *SUBMITTED), row))
        out.extend(
            f"pipeline {id_}: stored {key} differs from the event log (submitted by event {logged['event']})"
            for key in stored
            if stored[key] != logged.get(key)
        )
        expected = [[i, block_id, demand] for i, (block_id, demand) in enumerate(logged.get("demands", []))]
        if demands.get(id_, []) != expected:
            out.append(f"pipeline {id_}: stored demands differ from its submission (event {logged['event']})")
    out.extend(f"pipeline {i}: submitted by event {r['event']}, but its row is gone" for i, r in records.pipelines.items() if i not in seen)
    out.extend(f"demands of pipeline {i}: no such pipeline" for i in demands.keys() - seen)
    return out


def _floats(blob: bytes) -> list[float] | None:
    """A stored budget vector as a list (None if the BLOB is no float64 vector)."""
    try:
        return unpack(blob).tolist()
    except (TypeError, ValueError):
        return None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
