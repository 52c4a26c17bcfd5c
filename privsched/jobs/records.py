"""Block records: a job reads its records only from the blocks it was granted.

Each block is one NumPy ``.npz`` file of per-record arrays of equal length: ``tokens``
(n, L) int token ids (0 pads), ``sentiment`` (n,), ``category`` (n,), ``rating`` (n,),
``length`` (n,), plus the scalars ``vocab_size`` and ``n_categories`` (see
:mod:`workloads.reviews`). Files are opened through :meth:`JobContext.open_block` (the
supervisor's descriptors), which raises :class:`~privsched.jobs.context.BlockAccessError` for
any block outside the grant.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from privsched.jobs.context import JobContext

#: Scalars stored in every block file; every other array holds one row per record.
METADATA = ("vocab_size", "n_categories")


def load_blocks(ctx: JobContext, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Records of the given blocks (default: every granted block), concatenated.

    A key outside the grant raises :class:`BlockAccessError` before any block is touched."""
    keys = list(ctx.block_keys if keys is None else keys)
    for key in keys:
        if key not in ctx.blocks:
            ctx.open_block(key)  # raises: the context is the one gate to block data
    streams = [ctx.open_block(key) for key in keys]
    try:
        return read_block_files(streams)
    finally:
        for stream in streams:
            stream.close()


def read_block_files(files: Iterable[str | Path | BinaryIO]) -> dict[str, np.ndarray]:
    """Concatenate the records of block files (paths or open files); metadata scalars are
    combined with ``max`` (a vocabulary covering every block)."""
    parts: list[dict[str, np.ndarray]] = []
    for file in files:
        with np.load(file) as data:
            parts.append({name: data[name] for name in data.files})
    if not parts:
        raise ValueError("no blocks to read")
    columns = set(parts[0])
    if any(set(p) != columns for p in parts):
        raise ValueError("blocks hold different columns")
    records = {name: np.concatenate([p[name] for p in parts]) for name in sorted(columns) if name not in METADATA}
    if len({len(v) for v in records.values()}) != 1:
        raise ValueError("a block's columns have different numbers of records")
    for name in METADATA:
        if name in columns:
            records[name] = np.asarray(max(int(p[name]) for p in parts))
    return records


def column(records: dict[str, np.ndarray], name: str) -> np.ndarray:
    """One numeric per-record column, as floats; a clear error for unknown names."""
    if name in METADATA or name not in records or records[name].ndim != 1:
        choices = sorted(k for k, v in records.items() if k not in METADATA and v.ndim == 1)
        raise ValueError(f"unknown column {name!r} (the blocks hold {', '.join(choices)})")
    return records[name].astype(float)
