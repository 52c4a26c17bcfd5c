"""Checks of caller input, each raising :class:`LedgerError` with a one-line reason."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import numpy as np

from privsched.ledger.errors import LedgerError


def name(value: object, what: str) -> str:
    """A non-empty single-line name (dataset, block key, pipeline)."""
    if not isinstance(value, str) or not value.strip():
        raise LedgerError(f"{what} must be a non-empty string, got {value!r}")
    if any(ch in value for ch in "\r\n\t\0"):
        raise LedgerError(f"{what} {value!r} must not contain control characters")
    return value


def unique(values: Iterable[str], what: str) -> list[str]:
    values = list(values)
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise LedgerError(f"duplicate {what} {value!r}")
        seen.add(value)
    return values


def finite_number(value: object, what: str, *, low: float = 0.0, high: float = math.inf,
                  low_open: bool = False) -> float:
    """A finite float in [low, high] (or (low, high] with ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise LedgerError(f"{what} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        bound = "(" if low_open else "["
        raise LedgerError(f"{what} must be finite and in {bound}{low:g}, {high:g}], got {value!r}")
    return number


def vector(value: object, dims: int, what: str) -> np.ndarray:
    """A finite, non-negative budget vector of length ``dims``."""
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"{what} is not a numeric vector: {exc}") from exc
    if array.shape != (dims,):
        raise LedgerError(f"{what} must have {dims} values (one per budget dimension), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise LedgerError(f"{what} must be finite, got {array.tolist()}")
    if np.any(array < 0):
        raise LedgerError(f"{what} must be non-negative, got {array.tolist()}")
    return array


def now_or_clock(now: float | None) -> float:
    """The caller's clock reading, or the wall clock."""
    if now is None:
        return time.time()
    return finite_number(now, "now", low=-math.inf)
