"""Pydantic field types that accept only the numbers of :mod:`privsched.budgets.bounds`
(a separate module so that code that only checks numbers, such as the ledger, does not
import pydantic)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

from privsched.budgets.bounds import (
    MAX_EPSILON,
    MAX_NOISE,
    MAX_SENSITIVITY,
    MAX_STEPS,
    MIN_EPSILON,
    MIN_NOISE,
    MIN_SAMPLE_RATE,
    MIN_SENSITIVITY,
    check_delta,
    check_number,
)


def within(low: float, high: float, what: str = "", *, low_open: bool = False, integer: bool = False) -> BeforeValidator:
    """A pydantic validator accepting only :func:`check_number`'s values: a module-level
    ``Annotated[float, within(...)]`` alias is a float to a type checker."""
    return BeforeValidator(lambda v: check_number(v, what, low, high, low_open=low_open, integer=integer))


def bounded(low: float, high: float, what: str = "", *, low_open: bool = False, integer: bool = False) -> Any:
    """An annotated pydantic type accepting only :func:`check_number`'s values."""
    kind = int if integer else float
    return Annotated[kind, within(low, high, what, low_open=low_open, integer=integer)]


Epsilon = bounded(MIN_EPSILON, MAX_EPSILON)
Delta = Annotated[float, BeforeValidator(check_delta)]
Noise = bounded(MIN_NOISE, MAX_NOISE)
Sensitivity = bounded(MIN_SENSITIVITY, MAX_SENSITIVITY)
SampleRate = bounded(MIN_SAMPLE_RATE, 1.0)
Steps = bounded(0, MAX_STEPS, integer=True)
