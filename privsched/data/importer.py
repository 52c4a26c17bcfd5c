"""``blocks import``: a table (CSV, Parquet, JSON Lines) into sealed, fingerprinted blocks, all
or nothing (docs/design.md §9).

The files are streamed (:mod:`privsched.data.tables`); each row goes to its key's spill file
(Arrow IPC) in the store's staging folder; each key's rows are then written as one Parquet
file in row groups of :data:`ROW_GROUP` rows, so a block's bytes, and its SHA-256, depend
only on its rows and their order. Keys the dataset already has are kept when their rows are
exactly the block's (a file that grew by new days adds only the new days) and refused
otherwise: blocks are sealed once created. The new blocks are sealed in the store and
registered in one ledger transaction, with the table's schema; a refusal anywhere (a bad
value, a changed file, a full disk, data already registered) removes every file written.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privsched.data import people, tables
from privsched.data.store import BlockStore, default_store
from privsched.errors import BadInput
from privsched.ledger.catalog import schema_difference
from privsched.ledger.fingerprints import file_sha256
from privsched.ledger.models import BlockInfo, BlockSpec

if TYPE_CHECKING:
    import pyarrow as pa

    from privsched.ledger import Ledger

#: Rows per Parquet row group of a block file.
ROW_GROUP = 1 << 17
#: Most blocks one import may create (each has a spill file open while the table is read).
MAX_KEYS = 20_000


@dataclass(frozen=True)
class ImportReport:
    """What an import did."""

    dataset: str  # the dataset imported into
    added: list[BlockInfo]  # the blocks it created, in key order
    kept: list[str] = field(default_factory=list)  # keys already imported with exactly these rows
    grown: list[str] = field(default_factory=list)  # user blocks that gained a segment, in key order
    rows: int = 0  # rows read from the files
    store: str = ""  # the block store's folder


@dataclass
class _Block:
    """One key's rows while the table is read, then its sealed file."""

    spill: Path
    writer: Any  # pyarrow.ipc.RecordBatchStreamWriter, open while the table is read
    rows: int = 0
    staged: Path | None = None
    sha256: str = ""


class _Splitter:
    """Rows routed to one spill file per key, then each key written as one Parquet file."""

    def __init__(self, staging: Path, schema: pa.Schema) -> None:
        self.staging, self.schema = staging, schema
        self.blocks: dict[str, _Block] = {}
        self.valid: set[str] = set()

    def add(self, path: Path, batch: pa.RecordBatch, keys: pa.DictionaryArray) -> None:
        """Route a batch's rows to their keys' spill files, keeping their order."""
        import numpy as np
        import pyarrow as pa

        batch = pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)
        names = keys.dictionary.to_pylist()
        for name in names:
            if name not in self.valid:
                self.valid.add(tables.check_key(path, name))
        if len(names) == 1:
            self._block(names[0]).writer.write_batch(batch)
            self.blocks[names[0]].rows += batch.num_rows
            return
        codes = keys.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")
        ordered = batch.take(pa.array(order))
        ends = np.cumsum(np.bincount(codes, minlength=len(names)))
        start = 0
        for name, end in zip(names, ends.tolist()):
            block = self._block(name)
            block.writer.write_batch(ordered.slice(start, end - start))
            block.rows += end - start
            start = end

    def _block(self, key: str) -> _Block:
        import pyarrow as pa

        block = self.blocks.get(key)
        if block is None:
            if len(self.blocks) >= MAX_KEYS:
                raise BadInput(f"the table has more than {MAX_KEYS} block keys; import it in parts or use a coarser --every")
            spill = self.staging / f"{len(self.blocks)}.arrow"
            block = self.blocks[key] = _Block(spill, pa.ipc.new_stream(str(spill), self.schema))
        return block

    def finish(self) -> None:
        """Close the spill files and write each key's Parquet file (fixed row groups)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        for block in self.blocks.values():
            block.writer.close()
        for block in self.blocks.values():
            block.staged = block.spill.with_suffix(".parquet")
            with pa.OSFile(str(block.spill)) as source, pq.ParquetWriter(str(block.staged), self.schema) as writer:
                pending: list[pa.RecordBatch] = []
                held = 0
                for batch in pa.ipc.open_stream(source):
                    pending.append(batch)
                    held += batch.num_rows
                    while held >= ROW_GROUP:
                        table = pa.Table.from_batches(pending, schema=self.schema)
                        writer.write_table(table.slice(0, ROW_GROUP), row_group_size=ROW_GROUP)
                        pending, held = table.slice(ROW_GROUP).to_batches(), held - ROW_GROUP
                if held:
                    writer.write_table(pa.Table.from_batches(pending, schema=self.schema), row_group_size=ROW_GROUP)
            block.spill.unlink()
            block.sha256 = file_sha256(block.staged)

    def close(self) -> None:
        for block in self.blocks.values():
            try:
                block.writer.close()
            except Exception:  # noqa: BLE001 -- already closed, or the disk is full: the folder is removed anyway
                pass


def _more_open_files() -> None:
    """Raise the soft limit of open files to the hard one: one spill file per key is open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def import_blocks(
    ledger: Ledger,
    dataset: str,
    paths: Sequence[str | os.PathLike],
    *,
    by: str | None = None,
    every: str | None = None,
    partitions: int | None = None,
    store: str | os.PathLike | None = None,
    bounds: Mapping[str, Sequence[float]] | None = None,
    categories: Mapping[str, Sequence[str]] | None = None,
    unlocked: float = 0.0,
    actor: str | None = None,
) -> ImportReport:
    """Import the rows of ``paths`` into ``dataset``: one block per value (or ``every``
    period) of column ``by``, all in one transaction (module docstring); ``bounds`` and
    ``categories`` declare public column bounds and values (:func:`tables.declared_schema`).
    A dataset whose unit is a person's has its rows placed in ``partitions`` user blocks
    (:mod:`privsched.data.people`), by period of ``by`` too for ``user-time``."""
    import pyarrow as pa

    files = [Path(p) for p in paths]
    if not files:
        raise BadInput("no files to import")
    info = ledger.get_dataset(dataset)  # an unknown dataset is refused before any file is read
    people.check_options(info, by, every, partitions)
    person = info.unit != "record"
    count = people.partition_count(info, ledger.user_partitions(dataset), partitions) if person else 0
    placer = people.Placer(info, ledger.user_key(), count, by, every) if person else None
    known = ledger.dataset_schema(dataset)
    opened = [(path, tables.open_table(path)) for path in files]
    first_path, first = opened[0]
    columns = tables.columns_of(first.schema)
    for path, table in opened:
        if tables.columns_of(table.schema) != columns:
            difference = schema_difference(columns, tables.columns_of(table.schema))
            raise BadInput(f"{path}: its columns differ from {first_path}'s: {difference}")
        if info.user_column is not None:
            people.check_user_column(path, table.schema, info.user_column)
        if by is not None:
            tables.check_by(path, table.schema, by, every)
    if known is not None and known.columns != columns:
        raise BadInput(f"the table's columns differ from dataset {dataset!r}'s: {schema_difference(known.columns, columns)}")
    schema = tables.declared_schema(columns, bounds or {}, categories or {})
    existing = {b.key: b for b in ledger.list_blocks(dataset)}
    where = BlockStore(store if store is not None else default_store(ledger.path))
    _more_open_files()
    with where.incoming() as staging:
        splitter = _Splitter(staging, first.schema)
        try:
            total = 0
            for path, table in opened:
                stamp, rows = tables.Stamp.of(path), 0
                for batch in tables.batches(path, table):
                    if placer is not None:
                        keys = placer.keys_of(path, batch)
                    else:
                        keys = tables.keys_of(path, batch, by, every)  # type: ignore[arg-type]  # check_options: by is given
                    splitter.add(path, batch, keys)
                    rows += batch.num_rows
                if tables.Stamp.of(path) != stamp:
                    raise BadInput(f"{path}: the file changed while it was read; import it again once it is complete")
                if rows == 0:
                    raise BadInput(f"{path}: the file has no rows")
                total += rows
            splitter.finish()
        except OSError as exc:
            raise BadInput(f"cannot write the block store {where.folder}: {exc.strerror or tables.first_line(exc)}") from None
        except pa.ArrowException as exc:
            raise BadInput(f"cannot import: {tables.first_line(exc)}") from None
        finally:
            splitter.close()
        if person:
            staged = {key: (block.staged, block.sha256, block.rows) for key, block in splitter.blocks.items() if block.staged is not None}
            with where.locked():
                added = people.register(ledger, info, where, staged, count, schema, unlocked, actor)
            grown = sorted(set(staged) - {b.key for b in added})
            return ImportReport(dataset=dataset, added=added, grown=grown, rows=total, store=str(where.folder))
        kept, new = _compare(dataset, splitter.blocks, existing)
        with where.locked():
            added = _register(ledger, dataset, where, new, schema, unlocked, actor) if new else []
    return ImportReport(dataset=dataset, added=added, kept=kept, rows=total, store=str(where.folder))


def _compare(dataset: str, blocks: dict[str, _Block], existing: dict[str, BlockInfo]) -> tuple[list[str], dict[str, _Block]]:
    """Keys whose block already holds exactly these rows (kept), and the new keys; rows for a
    key whose block holds other rows are refused."""
    kept, new = [], {}
    for key in sorted(blocks):
        block = blocks[key]
        if key not in existing:
            new[key] = block
        elif existing[key].sha256 == block.sha256:
            kept.append(key)
        else:
            raise BadInput(
                f"block {key!r} of dataset {dataset!r} already exists with other rows: blocks are sealed once created, "
                "so new data must make new blocks"
            )
    return kept, new


def _register(
    ledger: Ledger,
    dataset: str,
    store: BlockStore,
    new: dict[str, _Block],
    schema: Any,
    unlocked: float,
    actor: str | None,
) -> list[BlockInfo]:
    """Seal the new blocks' files and record them in one ledger transaction; on any refusal
    the files this import put in the store are removed."""
    created: list[Path] = []
    try:
        specs = []
        for key, block in new.items():
            assert block.staged is not None  # set by finish()
            final, made = store.seal(block.staged, block.sha256)
            if made:
                created.append(final)
            specs.append(BlockSpec(key, str(final), block.sha256, block.rows))
        store.sync()
        return ledger.add_blocks(dataset, specs, unlocked_fraction=unlocked, actor=actor, schema=schema)
    except OSError as exc:
        store.remove(created)
        raise BadInput(f"cannot write the block store {store.folder}: {exc.strerror or exc}") from None
    except BaseException:
        store.remove(created)
        raise
