"""Reading what changed in the ledger since a point of its event log, for a reader that
keeps the pending pipelines and the block balances in memory (the scheduler,
:mod:`privsched.service.pending`).

Every change of a balance, of a pipeline's state or of a block's state appends an event
(docs/design.md §6), and event ids are consecutive (each transaction appends after the
last row, :class:`~privsched.ledger.moves.Moves`). So the events after the last one a
reader saw name every block and pipeline that changed since; the current rows of those
are read in the same read transaction, consistent with the events read. A span whose ids
are not consecutive, or that does not start right after the reader's last event (a
rewritten or replaced file), is a gap: the reader is told to read everything again.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np

from privsched.ledger.database import Database
from privsched.ledger import rows
from privsched.ledger.models import BlockInfo, DatasetInfo, PendingBatch
from privsched.ledger.schema import unpack_rows


@dataclass(frozen=True, eq=False)
class Changes:
    """The ledger's changes after event ``since`` up to event ``head``, or (``complete``)
    everything as of ``head``."""

    head: int  # the last event read (0: none yet)
    complete: bool  # a full read: it replaces everything the reader held
    datasets: list[DatasetInfo]  # created in the span (every dataset when complete)
    blocks: list[BlockInfo]  # whose balances or state changed (every block when complete)
    pending: dict[int, PendingBatch]  # dataset id -> submitted in the span, still pending (all, when complete)
    left: list[int]  # pipelines that left the pending state in the span
    arrivals: Counter[int]  # block id -> pipelines submitted for it in the span (ever, when complete)


def read_changes(db: Database, since: int | None) -> Changes | None:
    """The changes after event ``since`` (None: everything), or None for a gap (module
    docstring). Call inside one read transaction."""
    if since is None:
        return _everything(db)
    found = db.execute("SELECT id, kind, dataset_id, block_id, pipeline_id FROM events WHERE id >= ? ORDER BY id", [since]).fetchall()
    if since > 0:
        if not found or found[0][0] != since:
            return None
        found = found[1:]
    if found and (found[0][0] != since + 1 or found[-1][0] - found[0][0] + 1 != len(found)):
        return None
    if not found:
        return Changes(since, False, [], [], {}, [], Counter())
    created = sorted({d for _, kind, d, b, p in found if kind == "create" and b is None and p is None})
    block_ids = sorted({b for _, _, _, b, _ in found if b is not None})
    pipeline_ids = sorted({p for _, _, _, _, p in found if p is not None})
    submitted = sorted({p for _, kind, _, _, p in found if kind == "submit" and p is not None})
    states = dict(
        db.execute("SELECT id, state FROM pipelines WHERE id IN (SELECT value FROM json_each(?))", [json.dumps(pipeline_ids)]).fetchall()
    )
    still = [p for p in submitted if states.get(p) == "pending"]
    return Changes(
        head=found[-1][0],
        complete=False,
        datasets=_datasets(db, "id IN (SELECT value FROM json_each(?))", [json.dumps(created)]),
        blocks=_blocks(db, "b.id IN (SELECT value FROM json_each(?))", [json.dumps(block_ids)]),
        pending=pending_batches(db, "p.id IN (SELECT value FROM json_each(?))", [json.dumps(still)]),
        left=[p for p in pipeline_ids if states.get(p) != "pending"],
        arrivals=Counter(
            dict(
                db.execute(
                    "SELECT block_id, count(*) FROM demands WHERE pipeline_id IN (SELECT value FROM json_each(?)) GROUP BY block_id",
                    [json.dumps(submitted)],
                ).fetchall()
            )
        ),
    )


def _everything(db: Database) -> Changes:
    last = db.execute("SELECT max(id) FROM events").fetchone()[0]
    return Changes(
        head=last or 0,
        complete=True,
        datasets=_datasets(db, "1", []),
        blocks=_blocks(db, "1", []),
        pending=pending_batches(db, "p.state = 'pending'", []),
        left=[],
        arrivals=Counter(dict(db.execute("SELECT block_id, count(*) FROM demands GROUP BY block_id").fetchall())),
    )


def _datasets(db: Database, where: str, params: list) -> list[DatasetInfo]:
    return [
        rows.dataset(row) for row in db.execute(f"SELECT {rows.DATASET_COLUMNS} FROM datasets WHERE {where} ORDER BY id", params).fetchall()
    ]


def _blocks(db: Database, where: str, params: list) -> list[BlockInfo]:
    return [
        rows.block(row)
        for row in db.execute(f"SELECT {rows.BLOCK_COLUMNS} FROM {rows.BLOCK_FROM} WHERE {where} ORDER BY b.id", params).fetchall()
    ]


def _minimums(stored: list[float | None]) -> np.ndarray | None:
    """The pipelines' least accepted fractions (NULL: a fixed demand, 1.0); None when all are fixed."""
    if all(value is None for value in stored):
        return None
    return np.array([1.0 if value is None else value for value in stored], dtype=float)


def pending_batches(db: Database, where: str, params: list) -> dict[int, PendingBatch]:
    """Pending pipelines (of ``where`` over ``pipelines p``) with their demands, per dataset id."""
    found = db.execute(
        "SELECT p.id, p.dataset_id, p.submitted_at, p.weight, p.submitted_at + p.timeout, p.elastic_min "
        f"FROM pipelines p WHERE {where} AND p.state = 'pending' "
        "ORDER BY p.id",
        params,
    ).fetchall()
    if not found:
        return {}
    edges = db.execute(
        "SELECT e.pipeline_id, p.dataset_id, e.block_id, e.demand FROM demands e JOIN pipelines p ON p.id = e.pipeline_id "
        f"WHERE {where} AND p.state = 'pending' ORDER BY e.pipeline_id, e.position",
        params,
    ).fetchall()
    ids, datasets = (np.array(column, dtype=np.int64) for column in list(zip(*found))[:2])
    edge_ids, edge_datasets, edge_blocks = (np.array([row[i] for row in edges], dtype=np.int64) for i in range(3))
    dims = dict(db.execute("SELECT id, length(capacity) / 8 FROM datasets").fetchall())
    batches = {}
    for dataset_id in sorted(set(datasets.tolist())):  # not np.unique: it loads numpy.ma
        mine, edge_mine = datasets == dataset_id, np.flatnonzero(edge_datasets == dataset_id)
        batches[dataset_id] = PendingBatch(
            pipeline_ids=ids[mine],
            arrival=np.array([row[2] for row, keep in zip(found, mine) if keep], dtype=float),
            weight=np.array([row[3] for row, keep in zip(found, mine) if keep], dtype=float),
            deadline=np.array([np.inf if row[4] is None else row[4] for row, keep in zip(found, mine) if keep]),
            edge_pipeline=np.searchsorted(ids[mine], edge_ids[edge_mine]),
            edge_block=edge_blocks[edge_mine],
            edge_demand=unpack_rows([edges[i][3] for i in edge_mine.tolist()], int(dims[dataset_id])),
            elastic_min=_minimums([row[5] for row, keep in zip(found, mine) if keep]),
        )
    return batches
