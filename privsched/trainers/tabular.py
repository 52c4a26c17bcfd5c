"""A table's records as DP-SGD inputs, shaped by declarations only (docs/design.md §9).

A job names its ``features`` and its ``label``. Each numeric feature has public bounds
[lo, hi] and is clamped and scaled to [0, 1]; each categorical feature has declared
categories and is coded 0..k−1, with k for any value not declared; the label is a class index
(declared ``classes``, else the binary 0/1) or, for regression, a value clamped to its
bounds and scaled to [0, 1]. Bounds and categories come from the job, else from the
dataset's declarations (:func:`resolve_schema`), never from the data: the model's shape is
fixed before any record is read, and one record changes the inputs of that record alone.

No record can fail a job: a value outside its bounds is clamped, NaN (or a value that is not
a number) in a numeric feature counts as its lower bound, as in statistics; an unknown
category goes to its "unknown" code; a record whose label is not a declared class (or not a
number, for regression) is dropped, a transformation of that record alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from privsched.trainers.plans import DPSGDJob

#: What a dataset may declare about its columns: ``{column: {"bounds": [lo, hi]}}`` or
#: ``{column: {"categories": [...]}}``.
Declarations = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class TableSchema:
    """The declared shape of a job's table: features in the job's order, then the label."""

    numeric: dict[str, tuple[float, float]]  # numeric feature -> public bounds
    categorical: dict[str, list[Any]]  # categorical feature -> declared categories
    label: str
    classes: list[Any] | None  # classification: the label's classes
    label_bounds: tuple[float, float] | None  # regression: the label's public bounds

    @property
    def category_sizes(self) -> list[int]:
        """Codes of each categorical feature: its categories and one for "unknown"."""
        return [len(values) + 1 for values in self.categorical.values()]

    @property
    def n_outputs(self) -> int:
        return 1 if self.classes is None else len(self.classes)


def resolve_schema(job: DPSGDJob, declared: Declarations | None = None) -> TableSchema:
    """The schema of a tabular job: its own bounds and categories, else the dataset's
    ``declared`` ones. Raises a one-line ``ValueError`` for a feature with neither, or a
    regression label without bounds: before any data is read."""
    declared = declared or {}

    def bounds(column: str) -> tuple[float, float] | None:
        if column in job.bounds:
            return job.bounds[column]
        found = declared.get(column, {}).get("bounds")
        return None if found is None else (float(found[0]), float(found[1]))

    def categories(column: str) -> list[Any] | None:
        if column in job.categories:
            return list(job.categories[column])
        found = declared.get(column, {}).get("categories")
        return None if found is None else list(found)

    numeric: dict[str, tuple[float, float]] = {}
    categorical: dict[str, list[Any]] = {}
    for feature in job.features or []:
        if (values := categories(feature)) is not None:
            categorical[feature] = values
        elif (limits := bounds(feature)) is not None:
            numeric[feature] = limits
        else:
            raise ValueError(f"feature {feature!r} has neither declared bounds (numeric) nor declared categories")
    label = job.label_column
    if job.task == "regression":
        label_bounds = bounds(label)
        if label_bounds is None:
            raise ValueError(f"the regression label {label!r} has no declared bounds")
        return TableSchema(numeric, categorical, label, None, label_bounds)
    classes = list(job.classes) if job.classes is not None else categories(label) or [0, 1]
    if len(classes) < 2:
        raise ValueError("a label needs at least two distinct classes")
    return TableSchema(numeric, categorical, label, classes, None)


def as_numbers(values: np.ndarray) -> np.ndarray:
    """A column as float64; a value that is not a number becomes NaN."""
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        out = np.full(len(values), np.nan)
        for i, value in enumerate(values):
            try:
                out[i] = float(value)
            except (TypeError, ValueError):
                pass
        return out


def scaled(values: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """Values clamped to [lo, hi] (NaN to lo) and scaled to [0, 1]."""
    low, high = bounds
    x = as_numbers(values)
    x = np.clip(np.where(np.isnan(x), low, x), low, high)
    return (x - low) / (high - low)


def codes(values: np.ndarray, categories: list[Any]) -> np.ndarray:
    """Each value's index among ``categories``; ``len(categories)`` for any other value.
    Values are compared as numbers when both sides are numbers, else as text."""
    numeric = values.dtype.kind in "biuf" and all(isinstance(c, (int, bool)) for c in categories)
    table: dict[Any, int]  # float keys for numbers, else text
    if numeric:
        table = {float(c): i for i, c in enumerate(categories)}
        keys = np.asarray(values, dtype=np.float64)
    else:
        table = {str(c): i for i, c in enumerate(categories)}
        keys = np.asarray(values).astype(str)
    unique, inverse = np.unique(keys, return_inverse=True)
    mapped = np.array([table.get(u.item() if numeric else str(u), len(categories)) for u in unique], dtype=np.int64)
    return mapped[inverse.reshape(-1)] if len(unique) else np.zeros(0, dtype=np.int64)


def encode(records: Mapping[str, np.ndarray], schema: TableSchema) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) of the records whose label is usable: inputs (n, k) float32, the
    scaled numeric features then the category codes; labels int64 class indices or float32
    (n, 1) scaled regression targets. Unknown columns raise a one-line ``ValueError``."""
    inputs, labels, _ = encode_rows(records, schema)
    return inputs, labels


def encode_rows(records: Mapping[str, np.ndarray], schema: TableSchema) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As :func:`encode`, with the mask of the records kept (those whose label is usable)."""
    for name in [*schema.numeric, *schema.categorical, schema.label]:
        if name not in records or np.asarray(records[name]).ndim != 1:
            raise ValueError(f"the blocks have no column {name!r}")
    columns = [scaled(records[f], b) for f, b in schema.numeric.items()]
    columns += [codes(np.asarray(records[f]), c).astype(np.float64) for f, c in schema.categorical.items()]
    n = len(records[schema.label])
    inputs = np.stack(columns, axis=1).astype(np.float32) if columns else np.zeros((n, 0), np.float32)
    if schema.classes is not None:
        label = codes(np.asarray(records[schema.label]), schema.classes)
        keep = label < len(schema.classes)
        return inputs[keep], label[keep], keep
    raw = as_numbers(records[schema.label])
    keep = ~np.isnan(raw)
    target = scaled(raw[keep], schema.label_bounds)  # type: ignore[arg-type]
    return inputs[keep], target.astype(np.float32).reshape(-1, 1), keep
