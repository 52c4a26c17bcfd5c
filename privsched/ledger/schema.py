"""The ledger's SQLite schema, its version, and the encoding of budget vectors.

Vectors are stored as little-endian float64 BLOBs (``K × 8`` bytes): encoding and decoding
is one ``tobytes`` / ``frombuffer`` call with no parsing, it round-trips every float
exactly, and a batch of rows decodes into a (N, K) array with a single ``frombuffer``. JSON
arrays would be readable in the ``sqlite3`` shell but cost a parse per row on the grant
path; ``privsched budget show`` and ``Ledger.events`` are the readable views.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from privsched.ledger.database import Database
from privsched.ledger import launches

if TYPE_CHECKING:
    import numpy as np

#: Bumped whenever the schema changes; stored in ``PRAGMA user_version``. Version 2 added
#: the lease's generation and the launch records; version 3 the hash chain over the event
#: log (``events.detail`` and ``events.hash``); version 4 who caused each event
#: (``events.actor``), added to a version-3 file when it is opened (:func:`migrate`); version 5
#: each block's fingerprint (``blocks.sha256``, ``blocks.rows``) and each dataset's table
#: schema (``dataset_schemas``); version 6 each dataset's unit of privacy (``datasets.unit``,
#: ``user_column``, ``max_rows_per_user``, ``partitions``), the segments of user blocks
#: (``block_segments``) and the database's secrets (``secrets``); version 7 elastic demands
#: (``pipelines.elastic_min``, the least fraction of its demand a pipeline accepts, and
#: ``pipelines.fraction``, the fraction it was granted).
SCHEMA_VERSION = 7
#: The oldest schema version :func:`migrate` brings up to date.
MIGRATES_FROM = 3
#: ``PRAGMA application_id`` of a privsched database ("PrvS"): tells ours from a foreign file.
APPLICATION_ID = 0x50727653

#: The BLOBs' element type: little-endian float64. NumPy is imported by the functions that
#: decode or encode (a command that only lists names never does).
_FLOAT = "<f8"


def pack(vector: np.ndarray) -> bytes:
    """A budget vector as a float64 BLOB."""
    import numpy as np

    return np.ascontiguousarray(vector, dtype=_FLOAT).tobytes()


def unpack(blob: bytes) -> np.ndarray:
    """The budget vector stored in a BLOB (a writable copy)."""
    import numpy as np

    return np.frombuffer(blob, dtype=_FLOAT).copy()


def unpack_rows(blobs: list[bytes], dims: int) -> np.ndarray:
    """Many BLOBs of one dataset as a (N, K) array, decoded in one call."""
    import numpy as np

    if not blobs:
        return np.zeros((0, dims))
    return np.frombuffer(b"".join(blobs), dtype=_FLOAT).reshape(len(blobs), dims).copy()


def create_schema(db: Database) -> None:
    """Create every table, index and trigger (inside the caller's transaction)."""
    db.table("meta").create({"key": str, "value": str}, pk="key", strict=True)
    db.table("datasets").create(
        {
            "id": int,
            "name": str,
            "accounting": str,
            "alphas": str,  # JSON list of RDP orders ([] under basic)
            "epsilon": float,
            "delta": float,
            "conversion": str,
            "capacity": bytes,
            "created_at": float,
            "unit": str,  # record, user or user-time (NULL: record, a database older than version 6)
            "user_column": str,  # the column naming the person (user units)
            "max_rows_per_user": int,  # K, the rows of one person a read returns (user units)
            "partitions": int,  # P user partitions, set by the first import (user units)
        },
        pk="id",
        not_null=["name", "accounting", "alphas", "epsilon", "delta", "conversion", "capacity", "created_at"],
        strict=True,
    )
    db.table("datasets").create_index(["name"], unique=True)
    db.table("blocks").create(
        {
            "id": int,
            "dataset_id": int,
            "key": str,
            "location": str,
            "state": str,
            "created_at": float,
            "sha256": str,  # hex SHA-256 of its data, taken when it was created (NULL: no data then)
            "rows": int,  # records in it, counted when it was imported (NULL: not counted)
        },
        pk="id",
        foreign_keys=[("dataset_id", "datasets", "id")],
        not_null=["dataset_id", "key", "state", "created_at"],
        strict=True,
    )
    db.table("blocks").create_index(["dataset_id", "key"], unique=True)
    _create_fingerprints(db)
    _create_user_units(db)
    db.table("balances").create(
        {
            "block_id": int,
            "capacity": bytes,
            "locked": bytes,
            "unlocked": bytes,
            "allocated": bytes,
            "consumed": bytes,
        },
        pk="block_id",
        foreign_keys=[("block_id", "blocks", "id")],
        not_null=["capacity", "locked", "unlocked", "allocated", "consumed"],
        strict=True,
    )
    db.table("pipelines").create(
        {
            "id": int,
            "name": str,
            "dataset_id": int,
            "state": str,
            "owner": str,
            "weight": float,
            "timeout": float,
            "submitted_at": float,
            "granted_at": float,
            "started_at": float,
            "finished_at": float,
            "mechanism": str,
            "job": str,
            "resources": str,
            "placement": str,
            "message": str,
            "elastic_min": float,  # least fraction of its demand it accepts (NULL: a fixed demand)
            "fraction": float,  # fraction of its demand granted (NULL: all of it, or not granted)
        },
        pk="id",
        foreign_keys=[("dataset_id", "datasets", "id")],
        not_null=["name", "dataset_id", "state", "owner", "weight", "submitted_at", "job", "resources"],
        strict=True,
    )
    db.table("pipelines").create_index(["dataset_id", "state"])
    db.table("pipelines").create_index(["state"])
    db.table("demands").create(
        {"pipeline_id": int, "block_id": int, "position": int, "demand": bytes, "consumed": bytes},
        pk=("pipeline_id", "block_id"),
        foreign_keys=[("pipeline_id", "pipelines", "id"), ("block_id", "blocks", "id")],
        not_null=["position", "demand"],
        strict=True,
    )
    db.table("demands").create_index(["block_id"])
    db.table("events").create(
        {
            "id": int,
            "at": float,
            "kind": str,
            "dataset_id": int,
            "block_id": int,
            "pipeline_id": int,
            "source": str,
            "target": str,
            "amount": bytes,
            "reason": str,
            "detail": str,  # canonical JSON of what a creation or submission recorded (chain.py)
            "hash": bytes,  # SHA-256 link over the previous row's hash and this row (chain.py)
            "actor": str,  # who caused it: a user name, "operator" or "scheduler" (NULL before version 4)
        },
        pk="id",
        not_null=["at", "kind", "hash"],
        strict=True,
    )
    db.table("events").create_index(["pipeline_id"])
    db.table("events").create_index(["block_id"])
    db.table("lease").create(
        {"name": str, "holder": str, "pid": int, "host": str, "acquired_at": float, "expires_at": float, "generation": int},
        pk="name",
        not_null=["holder", "pid", "host", "acquired_at", "expires_at", "generation"],
        strict=True,
    )
    launches.create_table(db)
    # The event log is append-only: every balance must stay recomputable from it.
    for action in ("UPDATE", "DELETE"):
        db.execute(
            f"CREATE TRIGGER events_no_{action.lower()} BEFORE {action} ON events "
            "BEGIN SELECT RAISE(ABORT, 'the event log is append-only'); END"
        )
    db.table("meta").insert({"key": "schema_version", "value": str(SCHEMA_VERSION)})
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _create_fingerprints(db: Database) -> None:
    """The index of blocks by content and the table of each dataset's schema (version 5)."""
    db.execute("CREATE INDEX IF NOT EXISTS idx_blocks_sha256 ON blocks (sha256) WHERE sha256 IS NOT NULL")
    db.table("dataset_schemas").create(
        {"dataset_id": int, "definition": str},  # canonical JSON: columns, types, declared bounds and categories
        pk="dataset_id",
        foreign_keys=[("dataset_id", "datasets", "id")],
        not_null=["definition"],
        strict=True,
    )


def _create_user_units(db: Database) -> None:
    """The segments of user blocks and the database's secrets (version 6)."""
    db.table("block_segments").create(
        {"block_id": int, "name": str, "sha256": str, "rows": int, "created_at": float},
        pk=("block_id", "name"),
        foreign_keys=[("block_id", "blocks", "id")],
        not_null=["sha256", "rows", "created_at"],
        strict=True,
    )
    db.execute("CREATE INDEX IF NOT EXISTS idx_block_segments_sha256 ON block_segments (sha256)")
    # never in an API answer nor an event: only the import reads it (docs/privacy.md "Units")
    db.table("secrets").create({"name": str, "value": bytes}, pk="name", not_null=["value"], strict=True)


def migrate(db: Database, version: int) -> None:
    """Bring a database of schema ``version`` (at least :data:`MIGRATES_FROM`) up to
    :data:`SCHEMA_VERSION` (inside the caller's write transaction). 3 → 4 adds the
    ``events.actor`` column; 4 → 5 the blocks' ``sha256`` and ``rows`` and the
    ``dataset_schemas`` table; 5 → 6 the datasets' unit columns, ``block_segments`` and
    ``secrets``; 6 → 7 the pipelines' ``elastic_min`` and ``fraction``. The rows already there keep NULL, and their links (chain.py)
    are unchanged."""
    if version < 4:
        db.execute("ALTER TABLE events ADD COLUMN actor TEXT")
    if version < 5:
        db.execute("ALTER TABLE blocks ADD COLUMN sha256 TEXT")
        db.execute("ALTER TABLE blocks ADD COLUMN rows INTEGER")
        _create_fingerprints(db)
    if version < 6:
        for column, kind in (("unit", "TEXT"), ("user_column", "TEXT"), ("max_rows_per_user", "INTEGER"), ("partitions", "INTEGER")):
            db.execute(f"ALTER TABLE datasets ADD COLUMN {column} {kind}")
        _create_user_units(db)
    if version < 7:
        for column in ("elastic_min", "fraction"):
            db.execute(f"ALTER TABLE pipelines ADD COLUMN {column} REAL")
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
