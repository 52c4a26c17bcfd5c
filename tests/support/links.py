"""The event log's hash links computed from their definition in docs/ledger.md, with
:mod:`hashlib` and :mod:`struct` only, apart from ``privsched/ledger/chain.py``: a check
that recomputed links with the code under test would agree with any bug in it.

``hash_i = SHA-256(hash_{i-1} ‖ encode(row_i))``, ``hash_0 = SHA-256("privsched event log v2")``;
``encode`` is, per column, a one-byte type tag (``N`` NULL, ``I`` integer, ``F`` float,
``S`` text, ``B`` BLOB) followed by a signed 64-bit big-endian integer, an IEEE-754
binary64 big-endian float, or a 64-bit big-endian length and the bytes (text as UTF-8);
an event without an actor (before schema version 4) is encoded without that column."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence

#: The columns a link covers, in the documented order.
COLUMNS = ("id", "at", "kind", "dataset_id", "block_id", "pipeline_id", "source", "target", "amount", "reason", "detail", "actor")
GENESIS = hashlib.sha256(b"privsched event log v2").digest()


def encode(row: Sequence[object]) -> bytes:
    """The documented bytes of one event row (``id`` … ``actor``, without its hash)."""
    fields = row if row[-1] is not None else row[:-1]
    out = bytearray()
    for value in fields:
        if value is None:
            out += b"N"
        elif isinstance(value, int):
            out += b"I" + struct.pack(">q", value)
        elif isinstance(value, float):
            out += b"F" + struct.pack(">d", value)
        else:
            tag, data = (b"S", value.encode("utf-8")) if isinstance(value, str) else (b"B", bytes(value))
            out += tag + struct.pack(">Q", len(data)) + data
    return bytes(out)


def links(rows: Sequence[Sequence[object]]) -> Iterator[bytes]:
    """The hash of each row in turn, from the genesis link."""
    previous = GENESIS
    for row in rows:
        previous = hashlib.sha256(previous + encode(row)).digest()
        yield previous
