"""The scheduler's memory of the ledger: every dataset's pending pipelines and every
block's balances, kept up to date from the ledger's changes instead of being read again
for every pass (docs/design.md §4.3).

The ledger stays the truth. :meth:`PendingSet.refresh` reads only the events appended
since the last read and the rows they name (:mod:`privsched.ledger.changes`); on any
doubt (a gap in the event log, a grant the ledger refused, a new lease) the scheduler
calls :meth:`PendingSet.rebuild`, which reads everything again. Each refresh also reports
what it saw change (:class:`Marks`): the pipelines that arrived, the blocks whose unlocked
budget grew and those whose unconsumed budget shrank or that were retired. A pass of a
policy that orders pipelines one by one need only look at the pipelines those touch
(:meth:`privsched.service.scheduler.Scheduler.admit`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from privsched.ledger import Ledger
from privsched.ledger.changes import Changes
from privsched.ledger.models import BlockInfo, DatasetInfo, PendingBatch, PendingView


@dataclass
class Marks:
    """What changed since the marks were last cleared."""

    everything: bool = False  # read in full: treat every pipeline and block as changed
    arrived: set[int] = field(default_factory=set)  # pipelines that arrived (ids)
    gained: set[int] = field(default_factory=set)  # blocks whose unlocked budget grew at some dimension
    worsened: set[int] = field(default_factory=set)  # blocks whose consumed budget grew, or that were retired

    def add(self, other: Marks) -> None:
        self.everything |= other.everything
        self.arrived |= other.arrived
        self.gained |= other.gained
        self.worsened |= other.worsened

    def take(self) -> Marks:
        """These marks, leaving this object cleared."""
        taken = Marks(self.everything, self.arrived, self.gained, self.worsened)
        self.everything, self.arrived, self.gained, self.worsened = False, set(), set(), set()
        return taken


@dataclass(frozen=True, eq=False)
class BlockArrays:
    """The blocks of one dataset as arrays, by ascending database id."""

    ids: np.ndarray  # (B,) database ids
    created_at: np.ndarray  # (B,) creation times
    capacity: np.ndarray  # (B, K)
    locked: np.ndarray  # (B, K) updated in place as balances change, like the next two
    unlocked: np.ndarray  # (B, K)
    active: np.ndarray  # (B,) whether each block is active (not retired)


class PendingSet:
    """Pending pipelines per dataset and block balances, read from a ledger incrementally."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.head: int | None = None  # the last event read; None: read everything next
        self.datasets: dict[int, DatasetInfo] = {}  # by database id
        self.blocks: dict[int, BlockInfo] = {}  # by database id
        self.arrivals: Counter[int] = Counter()  # block id -> pipelines that ever asked for it
        self.tables: dict[int, PendingBatch] = {}  # dataset id -> its pending pipelines
        self._arrays: dict[str, BlockArrays] = {}  # dataset name -> its blocks, built on first use

    def rebuild(self) -> None:
        """Forget everything; the next :meth:`refresh` reads the ledger in full."""
        self.head = None

    def refresh(self) -> Marks:
        """Apply the ledger's changes since the last read (all of it after :meth:`rebuild`,
        or when the event log shows a gap)."""
        changes = self.ledger.changes(self.head)
        if changes is None:
            changes = self.ledger.changes(None)
            assert changes is not None  # a full read has no gap
        return self._apply(changes)

    @property
    def count(self) -> int:
        """How many pipelines are pending, over every dataset."""
        return sum(len(table.pipeline_ids) for table in self.tables.values())

    def _apply(self, changes: Changes) -> Marks:
        marks = Marks(everything=changes.complete)
        if changes.complete:
            self.datasets, self.blocks, self.tables, self._arrays = {}, {}, {}, {}
            self.arrivals = Counter()
        self.datasets.update((d.id, d) for d in changes.datasets)
        for block in changes.blocks:
            before = self.blocks.get(block.id)
            if before is None or np.any(block.unlocked > before.unlocked):
                marks.gained.add(block.id)
            if before is not None and (np.any(block.consumed > before.consumed) or block.state != before.state):
                marks.worsened.add(block.id)
            self.blocks[block.id] = block
            self._update_arrays(block, is_new=before is None)
        self.arrivals.update(changes.arrivals)
        if changes.left:
            left = np.array(changes.left, dtype=np.int64)
            for dataset_id, table in list(self.tables.items()):
                self.tables[dataset_id] = _without(table, left)
        for dataset_id, batch in changes.pending.items():
            known = self.tables.get(dataset_id)
            self.tables[dataset_id] = batch if known is None else _joined(known, batch)
            marks.arrived.update(batch.pipeline_ids.tolist())
        self.head = changes.head
        return marks

    def view(self, dataset_id: int, pipelines: np.ndarray | None = None) -> PendingView:
        """The pending pipelines of a dataset and the blocks a policy may see: the dataset's
        active blocks, and any retired block a pending pipeline still asks for. With
        ``pipelines`` (ids), only those pipelines and the blocks they ask for."""
        dataset = self.datasets[dataset_id]
        table = self.tables.get(dataset_id) or PendingBatch.empty(dataset.accounting.dims)
        if pipelines is not None:
            table = _select(table, _rows(table, pipelines))
        blocks = self.blocks_of(dataset)
        shown = np.isin(blocks.ids, table.edge_block)
        if pipelines is None:
            shown |= blocks.active
        return PendingView(
            accounting=dataset.accounting,
            block_ids=blocks.ids[shown],
            capacity=blocks.capacity[shown],
            unlocked=blocks.unlocked[shown],
            pipelines=table,
        )

    def next_deadline(self) -> float:
        """When the first pending pipeline times out (inf: none ever does)."""
        return min((float(t.deadline.min()) for t in self.tables.values() if len(t.deadline)), default=np.inf)

    def among(self, dataset_id: int, ids: set[int]) -> np.ndarray:
        """Those of ``ids`` that are pending pipelines of the dataset."""
        table = self.tables[dataset_id]
        return table.pipeline_ids[_rows(table, np.fromiter(ids, dtype=np.int64, count=len(ids)))]

    def blocks_of(self, dataset: DatasetInfo) -> BlockArrays:
        """The dataset's blocks as arrays (shared: read only)."""
        arrays = self._arrays.get(dataset.name)
        if arrays is None:
            rows = sorted((b for b in self.blocks.values() if b.dataset == dataset.name), key=lambda b: b.id)
            dims = dataset.accounting.dims
            arrays = BlockArrays(
                ids=np.array([b.id for b in rows], dtype=np.int64),
                created_at=np.array([b.created_at for b in rows], dtype=float),
                capacity=np.array([b.capacity for b in rows]).reshape(-1, dims),
                locked=np.array([b.locked for b in rows]).reshape(-1, dims),
                unlocked=np.array([b.unlocked for b in rows]).reshape(-1, dims),
                active=np.array([b.state == "active" for b in rows], dtype=bool),
            )
            self._arrays[dataset.name] = arrays
        return arrays

    def _update_arrays(self, block: BlockInfo, is_new: bool) -> None:
        arrays = self._arrays.get(block.dataset)
        if arrays is None:
            return
        if is_new:  # built again on next use
            del self._arrays[block.dataset]
            return
        row = int(np.searchsorted(arrays.ids, block.id))
        arrays.locked[row] = block.locked
        arrays.unlocked[row] = block.unlocked
        arrays.active[row] = block.state == "active"

    def touching(self, dataset_id: int, blocks: set[int]) -> np.ndarray:
        """Ids of the dataset's pending pipelines that ask for any of ``blocks``."""
        table = self.tables.get(dataset_id)
        if table is None or not blocks:
            return np.zeros(0, dtype=np.int64)
        hit = np.isin(table.edge_block, np.fromiter(blocks, dtype=np.int64))
        return table.pipeline_ids[np.unique(table.edge_pipeline[hit])]


def _rows(table: PendingBatch, ids: np.ndarray) -> np.ndarray:
    """A mask of the table's pipelines that are among ``ids``."""
    found = np.zeros(len(table.pipeline_ids), dtype=bool)
    if len(table.pipeline_ids) and len(ids):
        at = np.minimum(np.searchsorted(table.pipeline_ids, ids), len(table.pipeline_ids) - 1)
        found[at[table.pipeline_ids[at] == ids]] = True
    return found


def _without(table: PendingBatch, ids: np.ndarray) -> PendingBatch:
    """The table less the pipelines ``ids`` (absent ones are ignored)."""
    return _select(table, ~_rows(table, ids))


def _select(table: PendingBatch, keep: np.ndarray) -> PendingBatch:
    """The pipelines of the table where ``keep`` is true."""
    if keep.all():
        return table
    index = np.cumsum(keep) - 1
    kept = keep[table.edge_pipeline]
    return PendingBatch(
        pipeline_ids=table.pipeline_ids[keep],
        arrival=table.arrival[keep],
        weight=table.weight[keep],
        deadline=table.deadline[keep],
        edge_pipeline=index[table.edge_pipeline[kept]],
        edge_block=table.edge_block[kept],
        edge_demand=table.edge_demand[kept],
        elastic_min=None if table.elastic_min is None else table.elastic_min[keep],
    )


def _joined(table: PendingBatch, batch: PendingBatch) -> PendingBatch:
    """Both tables in one, in id order (a pipeline already in ``table`` is not added twice)."""
    batch = _without(batch, table.pipeline_ids)
    ids = np.concatenate([table.pipeline_ids, batch.pipeline_ids])
    joined = PendingBatch(
        pipeline_ids=ids,
        arrival=np.concatenate([table.arrival, batch.arrival]),
        weight=np.concatenate([table.weight, batch.weight]),
        deadline=np.concatenate([table.deadline, batch.deadline]),
        edge_pipeline=np.concatenate([table.edge_pipeline, batch.edge_pipeline + len(table.pipeline_ids)]),
        edge_block=np.concatenate([table.edge_block, batch.edge_block]),
        edge_demand=np.concatenate([table.edge_demand, batch.edge_demand]),
        elastic_min=None
        if table.elastic_min is None and batch.elastic_min is None
        else np.concatenate([table.minimums(), batch.minimums()]),
    )
    if np.all(ids[1:] > ids[:-1]):
        return joined
    order = np.argsort(ids, kind="stable")  # a batch older than the table (rare): regroup the edges
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    edges = np.argsort(rank[joined.edge_pipeline], kind="stable")
    return PendingBatch(
        pipeline_ids=ids[order],
        arrival=joined.arrival[order],
        weight=joined.weight[order],
        deadline=joined.deadline[order],
        edge_pipeline=rank[joined.edge_pipeline][edges],
        edge_block=joined.edge_block[edges],
        edge_demand=joined.edge_demand[edges],
        elastic_min=None if joined.elastic_min is None else joined.elastic_min[order],
    )
