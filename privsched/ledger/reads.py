"""Reading the ledger's tables into its data classes, inside the caller's transaction.

A :class:`Reader` works over one connection and caches datasets, which never change once
created. Both the façade's reads and the life-cycle transitions (:mod:`privsched.ledger.lifecycle`)
look things up through it, so a check made inside a write transaction sees that
transaction's own writes.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from privsched.ledger import rows
from privsched.ledger.errors import LedgerError
from privsched.ledger.models import BlockInfo, DatasetInfo, DatasetSchema, Event, PendingBatch, PendingView, PipelineInfo
from privsched.ledger.schema import unpack, unpack_rows

if TYPE_CHECKING:
    from privsched.ledger.database import Database


def unknown_dataset(name: str, names: Sequence[str]) -> str:
    """The refusal of a dataset name that is not among ``names``, with the closest of them
    when one is close (difflib's ratio ≥ 0.6): "unknown dataset 'tax'; did you mean 'taxi'?"."""
    close = difflib.get_close_matches(name, names, n=1)
    return f"unknown dataset {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")


class Reader:
    """Queries over one ledger connection (call them inside a transaction)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._datasets: dict[int, DatasetInfo] = {}

    def sql(self, sql: str, params: Sequence | None = None) -> list[tuple]:
        return self.db.execute(sql, params or []).fetchall()

    # --------------------------------------------------------------------- datasets
    def dataset(self, name: str) -> DatasetInfo:
        found = self.sql("SELECT id FROM datasets WHERE name = ?", [name])
        if not found:
            names = [row[0] for row in self.sql("SELECT name FROM datasets")]
            raise LedgerError(unknown_dataset(name, names))
        return self.dataset_by_id(found[0][0])

    def dataset_by_id(self, dataset_id: int) -> DatasetInfo:
        """Datasets never change once created, so each is read once per connection."""
        if dataset_id not in self._datasets:
            row = self.sql(f"SELECT {rows.DATASET_COLUMNS} FROM datasets WHERE id = ?", [dataset_id])[0]
            self._datasets[dataset_id] = rows.dataset(row)
        return self._datasets[dataset_id]

    def datasets(self) -> list[DatasetInfo]:
        return [rows.dataset(r) for r in self.sql(f"SELECT {rows.DATASET_COLUMNS} FROM datasets ORDER BY name")]

    def dataset_schema(self, dataset: str) -> DatasetSchema | None:
        found = self.sql("SELECT definition FROM dataset_schemas WHERE dataset_id = ?", [self.dataset(dataset).id])
        return DatasetSchema.from_dict(json.loads(found[0][0])) if found else None

    # ----------------------------------------------------------------------- blocks
    def blocks(self, where: str, params: Sequence) -> list[BlockInfo]:
        return [
            rows.block(r)
            for r in self.sql(f"SELECT {rows.BLOCK_COLUMNS} FROM {rows.BLOCK_FROM} WHERE {where} ORDER BY d.name, b.id", params)
        ]

    def dataset_blocks(self, dataset: str | None, active_only: bool) -> list[BlockInfo]:
        where = "1"
        params: list[object] = []
        if dataset is not None:
            where, params = "b.dataset_id = ?", [self.dataset(dataset).id]
        if active_only:
            where += " AND b.state = 'active'"
        return self.blocks(where, params)

    def block(self, dataset: str, key: str) -> BlockInfo:
        found = self.blocks("b.dataset_id = ? AND b.key = ?", [self.dataset(dataset).id, key])
        if not found:
            raise LedgerError(f"unknown block {key!r} in dataset {dataset!r}")
        return found[0]

    # -------------------------------------------------------------------- pipelines
    def pipelines(self, where: str, params: Sequence) -> list[PipelineInfo]:
        found = self.sql(f"SELECT {rows.PIPELINE_COLUMNS} FROM {rows.PIPELINE_FROM} WHERE {where} ORDER BY p.id", params)
        if not found:
            return []
        edges: dict[int, list] = {row[0]: [] for row in found}
        for pipeline_id, key, demand, consumed in self.sql(
            "SELECT e.pipeline_id, b.key, e.demand, e.consumed FROM demands e JOIN blocks b ON b.id = e.block_id "
            "WHERE e.pipeline_id IN (SELECT value FROM json_each(?)) ORDER BY e.pipeline_id, e.position",
            [json.dumps(list(edges))],
        ):
            edges[pipeline_id].append((key, demand, consumed))
        return [rows.pipeline(row, edges[row[0]]) for row in found]

    def pipeline(self, pipeline_id: int) -> PipelineInfo:
        found = self.pipelines("p.id = ?", [pipeline_id])
        if not found:
            raise LedgerError(f"unknown pipeline {pipeline_id}")
        return found[0]

    def pipelines_in(self, states: list[str] | None, dataset: str | None) -> list[PipelineInfo]:
        where: list[str] = ["1"]
        params: list[object] = []
        if states is not None:
            where.append("p.state IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(states))
        if dataset is not None:
            where.append("p.dataset_id = ?")
            params.append(self.dataset(dataset).id)
        return self.pipelines(" AND ".join(where), params)

    def released_statistics(self, dataset: str, mechanism: str | None) -> list[PipelineInfo]:
        """The completed built-in statistics of ``dataset`` charged for ``mechanism`` that
        are not themselves reuses: the releases a new statistic may reuse."""
        return self.pipelines(
            "p.state = 'completed' AND p.dataset_id = ? AND p.mechanism IS ? AND json_extract(p.job, '$.kind') = 'statistic' "
            "AND json_extract(p.job, '$.reused_from') IS NULL",
            [self.dataset(dataset).id, mechanism],
        )

    def pipeline_state(self, pipeline_id: int, allowed: Sequence[str], action: str) -> tuple[str, int]:
        """A pipeline's state and dataset id, checked to be in one of the ``allowed`` states."""
        found = self.sql("SELECT state, dataset_id FROM pipelines WHERE id = ?", [pipeline_id])
        if not found:
            raise LedgerError(f"unknown pipeline {pipeline_id}")
        state, dataset_id = found[0]
        if state not in allowed:
            raise LedgerError(f"cannot {action} pipeline {pipeline_id}: it is {state}")
        return state, dataset_id

    def pipeline_edges(self, pipeline_id: int, allowed: Sequence[str], action: str) -> tuple[str, int, list[tuple]]:
        """A pipeline's state, dataset id, and (block id, key, grant) edges, checked to be
        in one of the ``allowed`` states: the grant is the fraction of the demand it was
        granted (:func:`~privsched.budgets.elastic.granted_amount`), the demand before."""
        from privsched.budgets.elastic import granted_amount

        state, dataset_id = self.pipeline_state(pipeline_id, allowed, action)
        edges = [
            (block_id, key, granted_amount(unpack(demand), fraction))
            for block_id, key, demand, fraction in self.sql(
                "SELECT e.block_id, b.key, e.demand, p.fraction FROM demands e JOIN blocks b ON b.id = e.block_id "
                "JOIN pipelines p ON p.id = e.pipeline_id WHERE e.pipeline_id = ? ORDER BY e.position",
                [pipeline_id],
            )
        ]
        return state, dataset_id, edges

    def pending_view(self, dataset: str) -> PendingView:
        """The pending pipelines of a dataset and the blocks a policy may see: its active blocks
        and any retired block a pending pipeline still asks for."""
        import numpy as np

        from privsched.ledger.changes import pending_batches

        info = self.dataset(dataset)
        dims = info.accounting.dims
        pipelines = pending_batches(self.db, "p.dataset_id = ?", [info.id]).get(info.id) or PendingBatch.empty(dims)
        blocks = self.sql(
            "SELECT b.id, bal.capacity, bal.unlocked FROM blocks b JOIN balances bal ON bal.block_id = b.id "
            "WHERE b.dataset_id = ? AND (b.state = 'active' OR b.id IN (SELECT value FROM json_each(?))) "
            "ORDER BY b.id",
            [info.id, json.dumps(sorted(set(pipelines.edge_block.tolist())))],  # not np.unique: it loads numpy.ma
        )
        return PendingView(
            accounting=info.accounting,
            block_ids=np.array([row[0] for row in blocks], dtype=np.int64),
            capacity=unpack_rows([row[1] for row in blocks], dims),
            unlocked=unpack_rows([row[2] for row in blocks], dims),
            pipelines=pipelines,
        )

    # ----------------------------------------------------------------------- events
    def events(self, where: list[str], params: list) -> list[Event]:
        found = self.sql(f"SELECT {rows.EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY id", params)
        return [rows.event(row) for row in found]
