"""The contribution bound of a dataset whose unit is a person: every read of one of its
blocks holds at most K rows of each person (docs/privacy.md "Units").

Which K rows: those with the smallest 64-bit hash of the row's content, ties in the order
the rows were imported. A row's hash mixes (SplitMix64's finaliser, Steele, Lea & Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014) one 64-bit word per column,
in column-name order: a number's own bits, any other value's first 8 bytes of the SHA-256 of
its text. The choice is fixed, documented and depends only on that person's own rows, never
on anyone else's, so two datasets that differ in one person's rows give reads that differ
only in that person's at most K rows: the read is a 1-stable map from person-neighbouring
datasets to K-row-neighbouring tables, the premise of a sensitivity scaled by K (McSherry
2009, "Privacy integrated queries", §4: stable transformations). The hash needs no secret:
the guarantee holds whichever K rows are kept.

A ``user`` block holds each person once, so K per block is K per read of the whole dataset;
a ``user-time`` block holds one person's rows of one period, so K bounds the rows of a
person in each period (the unit those blocks protect).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

#: Prefix of every value's hashed text: the hash is this selection's own.
DOMAIN = b"privsched contribution bound v1\0"


@dataclass(frozen=True)
class Contribution:
    """At most ``k`` rows per value of ``user_column`` in each block read."""

    user_column: str
    k: int


#: SplitMix64's constants (Steele, Lea & Flood 2014).
_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(words: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of each word (uint64 arithmetic, wrapping)."""
    import numpy as np

    with np.errstate(over="ignore"):
        z = words + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        return z ^ (z >> np.uint64(31))


def _words(column: pa.ChunkedArray) -> np.ndarray:
    """One uint64 word per value: a number's bits (as int64 or float64), else the first 8
    bytes of the SHA-256 of its text (hashed once per distinct value; a null's text is None)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as types

    array = column.combine_chunks()
    if array.null_count == 0 and types.is_integer(array.type):
        return array.to_numpy().astype(np.int64).view(np.uint64)
    if array.null_count == 0 and types.is_floating(array.type):
        return array.to_numpy().astype(np.float64).view(np.uint64)
    encoded = pc.dictionary_encode(array)
    distinct = [*encoded.dictionary.to_pylist(), None]
    table = np.array(
        [int.from_bytes(hashlib.sha256(DOMAIN + repr(value).encode("utf-8", "surrogatepass")).digest()[:8], "big") for value in distinct],
        dtype=np.uint64,
    )
    codes = pc.fill_null(encoded.indices, pa.scalar(len(distinct) - 1, encoded.indices.type)).to_numpy()
    return table[codes]


def row_hashes(table: pa.Table) -> np.ndarray:
    """Each row's 64-bit hash of its content (module docstring), as uint64."""
    import numpy as np

    hashes = np.zeros(table.num_rows, dtype=np.uint64)
    for name in sorted(table.column_names):
        hashes = _mix(hashes ^ _words(table.column(name)))
    return hashes


def bound_rows(table: pa.Table, bound: Contribution) -> pa.Table:
    """``table`` (one block's rows) with at most ``bound.k`` rows per person (module
    docstring), in their order in the block. A person with at most K rows keeps them all."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if bound.user_column not in table.column_names:
        raise ValueError(f"the block has no user column {bound.user_column!r}")
    users = pc.dictionary_encode(table.column(bound.user_column).combine_chunks()).indices
    codes = pc.fill_null(users, pa.scalar(-1, users.type)).to_numpy().astype(np.int64)
    if table.num_rows == 0 or np.bincount(codes + 1).max() <= bound.k:
        return table
    positions = np.arange(table.num_rows)
    order = np.lexsort((positions, row_hashes(table), codes))  # by person, then hash, then position
    grouped = codes[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    rank = positions - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return table.take(pa.array(np.sort(order[rank < bound.k])))
