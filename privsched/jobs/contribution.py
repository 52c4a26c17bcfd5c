"""The contribution bound of a dataset whose unit is a person: every read of one of its
blocks holds at most K rows of each person (docs/privacy.md "Units").

Which K rows: those with the smallest SHA-256 of the row's content (the row as canonical
JSON, after a fixed prefix), ties being rows of equal content. The choice is fixed,
documented and depends only on that person's own rows, never on anyone else's nor on the
order of the file, so two datasets that differ in one person's rows give reads that differ
only in that person's at most K rows: the read is a 1-stable map from person-neighbouring
datasets to K-row-neighbouring tables, the premise of a sensitivity scaled by K
(McSherry 2009, "Privacy integrated queries", §4: stable transformations). The hash needs
no secret: the guarantee holds whichever K rows are kept.

A ``user`` block holds each person once, so K per block is K per read of the whole dataset;
a ``user-time`` block holds one person's rows of one period, so K bounds the rows of a
person in each period (the unit those blocks protect).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

#: Prefix of every hashed row: the hash is this selection's own.
DOMAIN = b"privsched contribution bound v1\0"


@dataclass(frozen=True)
class Contribution:
    """At most ``k`` rows per value of ``user_column`` in each block read."""

    user_column: str
    k: int


def row_digest(row: dict[str, Any]) -> bytes:
    """The SHA-256 ranking a row among its person's: of its content as canonical JSON."""
    text = json.dumps(row, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(DOMAIN + text.encode("utf-8", "surrogatepass")).digest()


def bound_rows(table: pa.Table, bound: Contribution) -> pa.Table:
    """``table`` (one block's rows) with at most ``bound.k`` rows per person (module
    docstring), in their order in the block. A person with at most K rows keeps them all."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if bound.user_column not in table.column_names:
        raise ValueError(f"the block has no user column {bound.user_column!r}")
    users = table.column(bound.user_column)
    counts = pc.value_counts(users)
    heavy = counts.field("values").filter(pc.greater(counts.field("counts"), bound.k))
    if len(heavy) == 0:
        return table
    over = pc.is_in(users, value_set=heavy).to_numpy(zero_copy_only=False)
    kept = ~over
    positions = np.flatnonzero(over)
    rows = table.take(pa.array(positions)).to_pylist()
    ranked: dict[Any, list[tuple[bytes, int]]] = {}
    for position, row in zip(positions.tolist(), rows):
        ranked.setdefault(row[bound.user_column], []).append((row_digest(row), position))
    for entries in ranked.values():
        entries.sort()
        kept[[position for _, position in entries[: bound.k]]] = True
    return table.filter(pa.array(kept))
