"""Block records: a job reads its records only from the blocks it was granted.

A block is a Parquet file (``blocks import`` writes them: one column per field, any Arrow
types) or a NumPy ``.npz`` file of per-record arrays of equal length, such as
:mod:`workloads.reviews`' ``tokens`` (n, L) int token ids (0 pads), ``sentiment`` (n,),
``category`` (n,), ``rating`` (n,), ``length`` (n,), plus the scalars ``vocab_size`` and
``n_categories``. The format is told by the file's first bytes. Every reader takes a path or
an open binary file object (seekable), so that blocks reach a job either way; files are
opened through :meth:`JobContext.open_block` (under a supervisor, descriptors it opened),
which raises :class:`~privsched.jobs.context.BlockAccessError` for any block outside the grant.
pyarrow is imported only when a Parquet block or an Arrow table is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from privsched.jobs.context import JobContext
from privsched.jobs.contribution import Contribution, bound_rows

if TYPE_CHECKING:
    import pyarrow as pa

#: A block file: its path, or an open binary file object.
#: One file of a block: its path or an open binary file.
BlockFile = str | Path | IO[bytes]
#: A block's data: one file, or the files of a block that is several (a user block's
#: Parquet segments, in name order), or a block's folder.
BlockSource = BlockFile | list[BlockFile]
#: The first (and last) four bytes of a Parquet file.
PARQUET_MAGIC = b"PAR1"
#: Scalars stored in every ``.npz`` block file; every other array holds one row per record.
METADATA = ("vocab_size", "n_categories")


def load_blocks(ctx: JobContext, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Records of the given blocks (default: every granted block), concatenated.

    A key outside the grant raises :class:`BlockAccessError` before any block is touched."""
    keys = list(ctx.block_keys if keys is None else keys)
    for key in keys:
        if key not in ctx.blocks:
            ctx.open_block(key)  # raises: the context is the one gate to block data
    opened = [ctx.block_files(key) for key in keys]
    try:
        return read_block_files([block_source(files) for files in opened], bound=ctx.contribution)
    finally:
        for files in opened:
            for stream in files.values():
                stream.close()


def block_source(files: Mapping[str, BlockFile]) -> BlockSource:
    """A block's files (:meth:`JobContext.block_files`, by name within it) as one source:
    the file of a one-file block, else every file in name order."""
    return files[""] if list(files) == [""] else [files[name] for name in sorted(files)]


def is_parquet(source: BlockSource) -> bool:
    """Whether a block file (path or binary file object) is Parquet (it starts with ``PAR1``);
    a folder or a list of files is a user block of Parquet segments (:mod:`privsched.data.people`)
    when its first file is Parquet."""
    if isinstance(source, list):
        return bool(source) and is_parquet(source[0])
    if isinstance(source, (str, Path)):
        if Path(source).is_dir():
            return True
        with open(source, "rb") as handle:
            return handle.read(4) == PARQUET_MAGIC
    position = source.tell()
    head = source.read(4)
    source.seek(position)
    return head == PARQUET_MAGIC


def _file(source: BlockFile) -> str | IO[bytes]:
    return str(source) if isinstance(source, Path) else source


def parquet_block(source: BlockSource, columns: Sequence[str] | None = None, bound: Contribution | None = None) -> pa.Table:
    """One Parquet block: a file, or a user block's folder of segments (read in name order);
    with ``bound``, at most K rows per person (:func:`~privsched.jobs.contribution.bound_rows`,
    on every column, before ``columns`` are selected)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted = None if columns is None or bound is not None else list(columns)
    segments: list[BlockFile] | None = None
    if isinstance(source, list):
        segments = source
    elif isinstance(source, (str, Path)) and Path(source).is_dir():
        segments = list(sorted(Path(source).glob("*.parquet")))  # type: ignore[arg-type]
    if segments is not None:
        if not segments:
            raise ValueError(f"user block {source} holds no segment")
        parts = [pq.read_table(_file(p), columns=wanted) for p in segments]
        table = pa.concat_tables([part.select(parts[0].column_names) for part in parts])  # one column order
    else:
        table = pq.read_table(_file(source), columns=wanted)  # type: ignore[arg-type]
    if bound is not None:
        table = bound_rows(table, bound)
        if columns is not None:
            table = table.select(list(columns))
    return table


def read_block_files(
    sources: Iterable[BlockSource], columns: Sequence[str] | None = None, bound: Contribution | None = None
) -> dict[str, np.ndarray]:
    """Concatenate the records of block files (paths or binary file objects), every column or
    only ``columns``, at most K rows per person in each block with ``bound``; metadata
    scalars of ``.npz`` blocks are combined with ``max`` (a vocabulary covering every block)."""
    parts: list[dict[str, np.ndarray]] = []
    for source in sources:
        if is_parquet(source):
            table = parquet_block(source, columns, bound)
            parts.append({name: table.column(name).to_numpy() for name in table.column_names})
        elif bound is not None:
            raise ValueError("a block of a user-unit dataset must be Parquet (imported by privsched)")
        else:
            for file in source if isinstance(source, list) else [source]:  # a folder block of .npz files
                with np.load(_file(file)) as data:
                    names = data.files if columns is None else [n for n in data.files if n in columns or n in METADATA]
                    parts.append({name: data[name] for name in names})
    if not parts:
        raise ValueError("no blocks to read")
    found = set(parts[0])
    if any(set(p) != found for p in parts):
        raise ValueError("blocks hold different columns")
    missing = sorted(set(columns or ()) - found)
    if missing:
        raise ValueError(f"unknown column {missing[0]!r} (the blocks hold {', '.join(sorted(found - set(METADATA)))})")
    records = {name: np.concatenate([p[name] for p in parts]) for name in sorted(found) if name not in METADATA}
    if len({len(v) for v in records.values()}) > 1:
        raise ValueError("a block's columns have different numbers of records")
    for name in METADATA:
        if name in found:
            records[name] = np.asarray(max(int(p[name]) for p in parts))
    return records


def read_table(sources: Iterable[BlockSource], columns: Sequence[str] | None = None, bound: Contribution | None = None) -> pa.Table:
    """The records of block files as one Arrow table (Parquet blocks read as they are, at most
    K rows per person in each with ``bound``; an ``.npz`` block's per-record arrays as
    columns, a 2-D array as fixed-size lists; its metadata scalars left out)."""
    import pyarrow as pa

    tables = []
    for source in sources:
        if is_parquet(source):
            try:
                tables.append(parquet_block(source, columns, bound))
            except (pa.ArrowInvalid, KeyError) as exc:
                raise ValueError(f"cannot read the columns asked for ({exc})") from None
            continue
        if bound is not None:
            raise ValueError("a block of a user-unit dataset must be Parquet (imported by privsched)")
        records = read_block_files([source], columns)
        arrays = {name: _arrow_array(values) for name, values in records.items() if name not in METADATA}
        tables.append(pa.table(arrays))
    if not tables:
        raise ValueError("no blocks to read")
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        raise ValueError("blocks hold different columns") from None


def _arrow_array(values: np.ndarray) -> pa.Array:
    import pyarrow as pa

    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, int(np.prod(values.shape[1:])))


def table_as(table: pa.Table, kind: str) -> Any:
    """An Arrow table as ``arrow`` (itself), ``numpy`` (column name -> array) or ``pandas``
    (a DataFrame; pandas must be installed)."""
    if kind == "arrow":
        return table
    if kind == "numpy":
        import pyarrow as pa

        out = {}
        for name in table.column_names:
            column = table.column(name)
            if pa.types.is_fixed_size_list(column.type):
                width = column.type.list_size
                out[name] = column.combine_chunks().flatten().to_numpy().reshape(-1, width)
            else:
                out[name] = column.to_numpy()
        return out
    if kind == "pandas":
        try:
            return table.to_pandas()
        except ImportError:
            raise ValueError("as_='pandas' needs pandas, which is not installed; use as_='arrow' or 'numpy'") from None
    raise ValueError(f"as_ must be 'arrow', 'numpy' or 'pandas', got {kind!r}")


def column(records: dict[str, np.ndarray], name: str) -> np.ndarray:
    """One numeric per-record column, as floats; a clear error for unknown names."""
    if name in METADATA or name not in records or records[name].ndim != 1:
        choices = sorted(k for k, v in records.items() if k not in METADATA and v.ndim == 1)
        raise ValueError(f"unknown column {name!r} (the blocks hold {', '.join(choices)})")
    return records[name].astype(float)
