"""The hash chain over the event log: every event row carries a SHA-256 link.

``hash_i = SHA-256(hash_{i-1} ‖ encode(row_i))`` with ``hash_0`` = :data:`GENESIS`, the
construction of a hash chain (Haber & Stornetta, "How to time-stamp a digital document",
J. Cryptology 1991; the append-only log of Crosby & Wallach, USENIX Security 2009). Under
SHA-256's collision resistance, an edit, deletion or insertion of any row changes every
later link, so a chain head kept outside the database (``privsched audit --export``) later
proves that history up to it was not rewritten; without such a kept head the chain shows
edits that were not followed by recomputing every later link.

``encode`` is a canonical byte string of every column of the row, the same under every
Python and SQLite version: each field is a one-byte type tag followed by a fixed-width
value (integers as signed 64-bit big-endian, floats as IEEE-754 binary64 big-endian) or by
a 64-bit length and the bytes (text as UTF-8, BLOBs raw); NULL is the tag alone. Fields are
self-delimiting, so rows with different values or different numbers of fields never encode
alike.

The last column, ``actor`` (who caused the event), came with schema version 4. An event
recorded before it has no actor (NULL) and its link covers the other columns exactly as it
always did, so an older log stays verifiable; every later event has an actor, and its link
covers it (:data:`LEGACY_COLUMNS`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence

#: The columns a link covers, in the order they are encoded (the whole ``events`` row but its hash).
COLUMNS = ("id", "at", "kind", "dataset_id", "block_id", "pipeline_id", "source", "target", "amount", "reason", "detail", "actor")
#: How many leading columns an event recorded before schema version 4 (no actor) is linked over.
LEGACY_COLUMNS = len(COLUMNS) - 1
#: The link before the first event (a domain-separated constant, not all zeros).
GENESIS = hashlib.sha256(b"privsched event log v2").digest()

_LENGTH = struct.Struct(">Q")
_INT = struct.Struct(">q")
_FLOAT = struct.Struct(">d")


def _field(value: object) -> bytes:
    if value is None:
        return b"N"
    if isinstance(value, bool):
        raise TypeError("a ledger event holds no booleans")
    if isinstance(value, int):
        return b"I" + _INT.pack(value)
    if isinstance(value, float):
        return b"F" + _FLOAT.pack(value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return b"S" + _LENGTH.pack(len(data)) + data
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return b"B" + _LENGTH.pack(len(data)) + data
    raise TypeError(f"cannot encode {type(value).__name__} in a ledger event")


def encode(row: Sequence[object]) -> bytes:
    """The canonical bytes of one event row (values in :data:`COLUMNS` order); a row whose
    actor is NULL (recorded before actors were) is encoded without it, as it was linked."""
    if len(row) != len(COLUMNS):
        raise ValueError(f"an event row has {len(COLUMNS)} columns, got {len(row)}")
    fields = row if row[-1] is not None else row[:LEGACY_COLUMNS]
    return b"".join(_field(value) for value in fields)


def link(previous: bytes, row: Sequence[object]) -> bytes:
    """``SHA-256(previous ‖ encode(row))``: the hash stored with ``row``."""
    return hashlib.sha256(previous + encode(row)).digest()


def extend(previous: bytes, rows: Iterable[Sequence[object]]) -> Iterator[bytes]:
    """The hashes of ``rows`` appended, in order, after a row whose hash is ``previous``."""
    for row in rows:
        previous = link(previous, row)
        yield previous


def format_head(event_id: int, digest: bytes) -> str:
    """A chain head as ``<event id>:<hex SHA-256>`` (``0:<genesis>`` for an empty log)."""
    return f"{event_id}:{digest.hex()}"


def parse_head(text: str) -> tuple[int, bytes]:
    """The (event id, hash) of a head written by :func:`format_head`; ValueError otherwise."""
    event_id, sep, digest = text.strip().partition(":")
    try:
        if not sep or not event_id.isdigit():
            raise ValueError
        raw = bytes.fromhex(digest)
        if len(raw) != hashlib.sha256().digest_size:
            raise ValueError
    except ValueError:
        raise ValueError(f"a chain head is '<event id>:<64 hex digits>', got {text!r}") from None
    return int(event_id), raw
