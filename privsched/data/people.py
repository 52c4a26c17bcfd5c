"""Imports into a dataset whose unit is a person (``user``) or a person in one period
(``user-time``): rows are placed by who they are about (docs/privacy.md "Units").

A person's partition is ``HMAC-SHA256(key, user id as UTF-8 text) mod P``, the key being the
database's secret (:meth:`~privsched.ledger.Ledger.user_key`, never shown), so a submitter
cannot choose or predict which block holds a person. A ``user`` block is one partition
(key ``u007`` of P = 1000); a ``user-time`` block is one partition in one period (key
``2026-10-01.u007``). Every row of a person therefore lands in the same block, whichever
import it comes in.

User blocks grow: this is the one exception to sealing. A block is a folder in the store
holding one immutable Parquet *segment* per import that had rows for it (``000003-<sha256>.parquet``,
written once, fingerprinted; the block's fingerprint is the folder's). Sealing exists so that
data arriving later gets a fresh budget only if it is about other records; a person's later
rows are the same person, so they must join the budget that already protects that person:
the block's budget covers everything the person ever contributes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privsched.data import tables
from privsched.errors import BadInput
from privsched.ledger.fingerprints import file_sha256, location_sha256
from privsched.ledger.models import BlockInfo, DatasetInfo, Segment

if TYPE_CHECKING:
    import pyarrow as pa

    from privsched.data.store import BlockStore
    from privsched.ledger import Ledger

#: The most user partitions a dataset may have.
MAX_PARTITIONS = 10_000


def partition_count(info: DatasetInfo, fixed: int | None, given: int | None) -> int:
    """The dataset's P: the one ``fixed`` by its first import, else ``given``."""
    if given is not None and (isinstance(given, bool) or not isinstance(given, int) or not 1 <= given <= MAX_PARTITIONS):
        raise BadInput(f"--partitions must be an integer from 1 to {MAX_PARTITIONS}, got {given!r}")
    if fixed is not None:
        if given is not None and given != fixed:
            raise BadInput(f"dataset {info.name!r} has {fixed} user partitions, fixed at its first import; got --partitions {given}")
        return fixed
    if given is None:
        raise BadInput(f"dataset {info.name!r} is a {info.unit}-unit dataset: its first import needs --partitions P")
    return given


def check_options(info: DatasetInfo, by: str | None, every: str | None, partitions: int | None) -> None:
    """The import's options fit the dataset's unit."""
    if info.unit == "record":
        if partitions is not None:
            raise BadInput(f"dataset {info.name!r} is a record-unit dataset: --partitions is for user or user-time datasets")
        if by is None:
            raise BadInput(f"dataset {info.name!r} is a record-unit dataset: give --by COLUMN")
    elif info.unit == "user" and (by is not None or every is not None):
        raise BadInput(f"dataset {info.name!r} is a user-unit dataset: its blocks are user partitions, so --by and --every do not apply")
    elif info.unit == "user-time" and by is None:
        raise BadInput(f"dataset {info.name!r} is a user-time dataset: give --by DATE (and --every) for the period")


def check_user_column(path: Path, schema: pa.Schema, column: str) -> None:
    if column not in schema.names:
        raise BadInput(f"{path}: no user column {column!r} (it has {', '.join(schema.names)})")


def partition_names(count: int) -> list[str]:
    """Each partition's key part: ``u0`` … ``u{P-1}``, zero-padded to one width."""
    width = len(str(count - 1))
    return [f"u{p:0{width}d}" for p in range(count)]


class Placer:
    """Where each row of one import goes: its person's partition, ``HMAC-SHA256(key, str(user
    id)) mod count`` (one HMAC per distinct id in the import), and its block's key."""

    def __init__(self, info: DatasetInfo, key: bytes, count: int, by: str | None, every: str | None) -> None:
        assert info.user_column is not None  # a person's unit always names it
        self.info, self.key, self.count, self.by, self.every = info, key, count, by, every
        self.column = info.user_column
        self.placed: dict[object, int] = {}
        self.names = partition_names(count)

    def partitions(self, path: Path, users: pa.Array) -> pa.Array:
        """Each row's partition; a row without a user id is refused."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if users.null_count:
            row = pc.index(pc.is_null(users), True).as_py()
            raise BadInput(f"{path}: the user column has no value in a row (row {row + 1} of a batch); every row needs its person")
        distinct = pc.unique(users)
        parts = []
        for user in distinct.to_pylist():
            part = self.placed.get(user)
            if part is None:
                digest = hmac.digest(self.key, str(user).encode("utf-8"), "sha256")
                part = self.placed[user] = int.from_bytes(digest[:8], "big") % self.count
            parts.append(part)
        return pc.take(pa.array(parts, pa.int32()), pc.index_in(users, value_set=distinct))

    def keys_of(self, path: Path, batch: pa.RecordBatch) -> pa.DictionaryArray:
        """Each row's block key, dictionary-encoded: its partition, after its period for user-time."""
        import pyarrow as pa
        import pyarrow.compute as pc

        names = pc.take(pa.array(self.names), self.partitions(path, batch.column(self.column)))
        if self.info.unit == "user-time":
            assert self.by is not None  # check_options
            periods = tables.keys_of(path, batch, self.by, self.every)
            names = pc.binary_join_element_wise(periods.dictionary_decode(), names, ".")
        encoded = pc.dictionary_encode(names)
        return pa.DictionaryArray.from_arrays(encoded.indices, encoded.dictionary)


def folder_of(store: BlockStore, info: DatasetInfo, key: str) -> Path:
    """A user block's folder in the store, named by a hash of (dataset id, key) so that no
    name the user chose becomes a path."""
    return store.folder / "users" / hashlib.sha256(f"{info.id}\0{key}".encode()).hexdigest()[:32]


def register(
    ledger: Ledger,
    info: DatasetInfo,
    store: BlockStore,
    staged: dict[str, tuple[Path, str, int]],
    count: int,
    schema: Any,
    unlocked: float,
    actor: str | None,
) -> list[BlockInfo]:
    """Append each key's staged segment (path, SHA-256, rows) to its block's folder (where the
    block already is, whichever store this import uses) and record all of them in one ledger
    transaction; on any refusal the segments written are removed
    (and the folders this import made)."""
    written: list[Path] = []
    made: list[Path] = []
    registered = {b.key: b.location for b in ledger.list_blocks(info.name)}
    counts = ledger.segment_counts(info.name)
    try:
        segments = []
        for key, (path, sha256, rows) in sorted(staged.items()):
            known = registered.get(key)
            folder = Path(known) if known is not None else folder_of(store, info, key)
            if not folder.exists():
                folder.mkdir(mode=0o700, parents=True)
                made.append(folder)
            final = folder / f"{counts.get(key, 0):06d}-{sha256}.parquet"
            os.chmod(path, 0o600)
            os.link(path, final)
            written.append(final)
            if file_sha256(final) != sha256:
                raise BadInput(f"block store file {final} does not hold what was written; run `privsched audit`")
            segments.append(Segment(key, str(folder), final.name, sha256, rows, location_sha256(folder)))
        store.sync()
        return ledger.add_segments(info.name, segments, count, schema, unlocked, actor=actor)
    except OSError as exc:
        _remove(written, made)
        raise BadInput(f"cannot write the block store {store.folder}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(written, made)
        raise


def _remove(files: list[Path], folders: list[Path]) -> None:
    for path in files:
        path.unlink(missing_ok=True)
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass
