"""Reading a user's table for import: CSV, Parquet or JSON Lines, streamed in record batches
(``pyarrow.dataset``, so a file larger than memory is never held whole), each row keyed by
the value of one column, or by the day, week or month of a date or time column.

A key is what the block of those rows is called: the value itself (a date as
``2026-10-01``), a day (``2026-10-01``), a week (its Monday, ``2026-09-28``) or a month
(``2026-10``). pyarrow is imported inside the functions (``privsched --help`` stays fast).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privsched.errors import BadInput
from privsched.ledger.models import DatasetSchema
from privsched.text import name_problem

if TYPE_CHECKING:
    import pyarrow as pa

#: File name endings and the format each stands for.
FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "json", ".ndjson": "json"}
#: Periods ``--every`` groups a date or time column by, and each key's ``strftime`` format.
PERIODS = {"day": "%Y-%m-%d", "week": "%Y-%m-%d", "month": "%Y-%m"}
#: Rows per record batch read.
BATCH_ROWS = 1 << 17


@dataclass(frozen=True)
class Stamp:
    """What a file was when its reading began: a change while it is read is refused."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> Stamp:
        try:
            info = os.stat(path)
        except OSError as exc:
            raise BadInput(f"{path}: {exc.strerror or exc} (the file changed while it was read)") from None
        return cls(info.st_size, info.st_mtime_ns, info.st_ino)


def file_format(path: Path) -> str:
    """The format a file's name ending says (``csv``, ``parquet`` or ``json``)."""
    found = FORMATS.get(path.suffix.lower())
    if found is None:
        raise BadInput(f"{path}: unknown format (the file name must end in one of {', '.join(FORMATS)})")
    return found


def open_table(path: Path) -> Any:
    """A ``pyarrow.dataset`` over one readable file, after checking it exists."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    kind = file_format(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise BadInput(f"{path}: not readable")
    try:
        return ds.dataset(str(path), format=kind)
    except (pa.ArrowException, OSError) as exc:
        raise BadInput(f"{path}: cannot be read as {kind} ({first_line(exc)})") from None


def first_line(exc: BaseException) -> str:
    """An exception's message, on one line."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def columns_of(schema: pa.Schema) -> dict[str, str]:
    """A table's column names and their Arrow types, as text."""
    return {field.name: str(field.type) for field in schema}


def check_by(path: Path, schema: pa.Schema, by: str, every: str | None) -> None:
    """The ``--by`` column exists and can key blocks (a date or time with ``--every``)."""
    import pyarrow.types as types

    if by not in schema.names:
        raise BadInput(f"{path}: no column {by!r} to key blocks by (it has {', '.join(schema.names)})")
    kind = schema.field(by).type
    if types.is_null(kind):
        raise BadInput(f"{path}: the file has no rows with a value in column {by!r}")
    if every is not None:
        if every not in PERIODS:
            raise BadInput(f"--every must be one of {', '.join(PERIODS)}, got {every!r}")
        if not (types.is_date(kind) or types.is_timestamp(kind) or types.is_string(kind) or types.is_large_string(kind)):
            raise BadInput(f"{path}: column {by!r} is {kind}, not a date or time, so it cannot be grouped by {every}")
    elif types.is_timestamp(kind):
        raise BadInput(f"{path}: column {by!r} holds times; give --every day, week or month to group them")
    elif not (types.is_date(kind) or types.is_integer(kind) or types.is_string(kind) or types.is_large_string(kind)):
        raise BadInput(f"{path}: column {by!r} is {kind}; blocks are keyed by dates, integers or text")


def batches(path: Path, table: Any) -> Iterator[pa.RecordBatch]:
    """The file's record batches; a value the reader cannot convert is one line naming it."""
    import pyarrow as pa

    try:
        for batch in table.to_batches(batch_size=BATCH_ROWS):
            if batch.num_rows:
                yield batch
    except (pa.ArrowException, OSError) as exc:
        raise BadInput(f"{path}: cannot be read ({first_line(exc)})") from None


def keys_of(path: Path, batch: pa.RecordBatch, by: str, every: str | None) -> pa.DictionaryArray:
    """The block key of each row, dictionary-encoded (the keys, as text, are the dictionary):
    the ``by`` value, or its period with ``every``. Only the distinct values are formatted."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as types

    values = batch.column(by)
    if values.null_count:
        row = pc.index(pc.is_null(values), True).as_py()
        raise BadInput(f"{path}: column {by!r} has no value in a row (row {row + 1} of a batch); every row needs a block key")
    kind = values.type
    if every is not None:
        if types.is_string(kind) or types.is_large_string(kind):
            try:
                values = pc.strptime(values, format="%Y-%m-%d", unit="s", error_is_null=False)
            except pa.ArrowInvalid:
                try:
                    values = pc.cast(values, pa.timestamp("s"))
                except pa.ArrowInvalid as exc:
                    raise BadInput(f"{path}: column {by!r} has a value that is not a date or time ({first_line(exc)})") from None
        if every != "day" or types.is_timestamp(values.type):
            values = pc.floor_temporal(values, unit=every, week_starts_monday=True)
        encoded = pc.dictionary_encode(values)
        names = pc.strftime(encoded.dictionary, format=PERIODS[every])
    else:
        encoded = pc.dictionary_encode(values)
        names = pc.strftime(encoded.dictionary, format="%Y-%m-%d") if types.is_date(kind) else pc.cast(encoded.dictionary, pa.string())
    return pa.DictionaryArray.from_arrays(encoded.indices, names)


def check_key(path: Path, key: str) -> str:
    """A key that is a valid block name (:func:`privsched.text.name_problem`)."""
    problem = name_problem(key)
    if problem is not None:
        shown = repr(key) if len(key) <= 80 else repr(key[:77] + "...")
        raise BadInput(f"{path}: {shown} is not a valid block key: it {problem}")
    return key


def parse_declarations(bounds: Sequence[str], categories: Sequence[str]) -> tuple[dict[str, tuple[float, float]], dict[str, list[str]]]:
    """``COL=LOW:HIGH`` bounds and ``COL=A,B,C`` categories (as the command line and the HTTP
    API take them) as mappings; each column at most once in each."""
    parsed_bounds: dict[str, tuple[float, float]] = {}
    for text in bounds:
        name, sep, pair = text.partition("=")
        low, colon, high = pair.partition(":")
        try:
            values = (float(low), float(high))
        except ValueError:
            values = (math.nan, math.nan)
        if not sep or not name or not colon or not all(math.isfinite(v) for v in values):
            raise BadInput(f"--bounds must be COLUMN=LOW:HIGH with finite numbers, got {text!r}")
        if name in parsed_bounds:
            raise BadInput(f"--bounds names column {name!r} twice")
        parsed_bounds[name] = values
    parsed_categories: dict[str, list[str]] = {}
    for text in categories:
        name, sep, listed = text.partition("=")
        if not sep or not name or not listed:
            raise BadInput(f"--categories must be COLUMN=A,B,..., got {text!r}")
        if name in parsed_categories:
            raise BadInput(f"--categories names column {name!r} twice")
        parsed_categories[name] = listed.split(",")
    return parsed_bounds, parsed_categories


def declared_schema(
    columns: dict[str, str], bounds: Mapping[str, Sequence[float]], categories: Mapping[str, Sequence[str]]
) -> DatasetSchema:
    """The table's schema with its declared public ``bounds`` (``column -> (low, high)``, on
    numeric columns, finite with low < high) and ``categories`` (``column -> values``,
    distinct and non-empty), each naming a column of the table."""
    numeric = ("int", "uint", "float", "double", "decimal")
    declared_bounds: dict[str, tuple[float, float]] = {}
    for name, pair in bounds.items():
        try:
            lo, hi = (float(v) for v in pair)
        except (TypeError, ValueError):
            lo = hi = math.nan
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise BadInput(f"the bounds of column {name!r} must be finite with LOW < HIGH, got {list(pair)!r}")
        if name not in columns:
            raise BadInput(f"bounds are declared for column {name!r}, which the table does not have")
        if not columns[name].startswith(numeric):
            raise BadInput(f"bounds are declared for column {name!r}, which is {columns[name]}, not a number")
        declared_bounds[name] = (lo, hi)
    declared_categories: dict[str, list[str]] = {}
    for name, listed in categories.items():
        values = [str(v) for v in listed]
        if not values or not all(values) or len(set(values)) != len(values):
            raise BadInput(f"the categories of column {name!r} must be distinct non-empty values, got {values!r}")
        if name not in columns:
            raise BadInput(f"categories are declared for column {name!r}, which the table does not have")
        declared_categories[name] = values
    return DatasetSchema(columns=dict(columns), bounds=declared_bounds, categories=declared_categories)
