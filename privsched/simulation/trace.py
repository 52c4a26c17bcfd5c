"""Trace files: a whole workload (blocks and pipelines) as one JSON document.

A trace is validated entry by entry; every problem is reported as one :class:`TraceError`
line naming the offending entry (``pipelines[3] 'p3': ...``). Loading a trace also compiles
it (:func:`privsched.simulation.compile.compile_trace`), so a trace that loads is one the
simulator can run. Saving writes to a temporary file renamed into place: a failed save
leaves no partial file behind.

Format (times in seconds)::

    {"accounting": "basic" | "rdp", "alphas": [...],
     "blocks": [{"id": "b0", "arrival": 0.0, "epsilon": 1.0, "delta": 1e-6}, ...],
     "pipelines": [{"id": "p0", "arrival": 1.0, "blocks": ["b0"] | {"last": 10},
                    "epsilon": 0.01, "delta": 1e-9, "demands": {"b0": 0.5},
                    "curve": [...], "mechanism": "gaussian" | {...},
                    "weight": 1, "timeout": 300, "class": "mice", "team": "blue"}, ...],
     "quotas": {"blue": 0.3}}

``quotas`` gives a team's share of every block's capacity (docs/design.md §4.2); a
pipeline's ``team`` is under its team's quota, if it has one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from privsched.budgets.bounds import MAX_DEMAND, MAX_ORDER, MIN_EPSILON
from privsched.budgets.fields import Delta, Epsilon, bounded, within
from privsched.budgets.mechanisms import Mechanism, parse_mechanism
from privsched.documents import check_depth, parse_json, read_text
from privsched.simulation.limits import MAX_ORDERS, MAX_TIME, MAX_TRACE_BYTES, TraceError
from privsched.spec import MAX_LAST, MAX_WEIGHT, MIN_DURATION, MIN_WEIGHT, Name
from privsched.text import printable

if TYPE_CHECKING:
    from privsched.simulation.instance import Instance

#: Mechanisms a pipeline may name with a string; they are calibrated to its (ε, δ).
MECHANISM_NAMES = ("gaussian", "laplace")

Time = Annotated[float, within(-MAX_TIME, MAX_TIME)]
Weight = Annotated[float, within(MIN_WEIGHT, MAX_WEIGHT)]
Timeout = Annotated[float, within(MIN_DURATION, MAX_TIME)]
Share = Annotated[float, within(MIN_EPSILON, MAX_DEMAND)]
CurveValue = Annotated[float, within(0.0, MAX_DEMAND)]
QuotaShare = Annotated[float, within(0.0, 1.0)]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TraceBlock(_Entry):
    """A block: it exists from ``arrival`` on, with global budget (ε_G, δ_G)."""

    id: Name
    arrival: Time = 0.0
    epsilon: Epsilon
    delta: Delta = 0.0


class LastBlocks(_Entry):
    """The ``last`` k blocks that exist when the pipeline arrives."""

    last: bounded(1, MAX_LAST, integer=True)  # type: ignore[valid-type]


class TracePipeline(_Entry):
    """A pipeline: its blocks, its demand (one of epsilon/demands/curve/mechanism), weight and timeout."""

    id: Name
    arrival: Time
    blocks: list[Name] | LastBlocks
    epsilon: Epsilon | None = None
    delta: Delta = 0.0
    demands: dict[Name, Share] | None = None
    curve: list[CurveValue] | None = Field(None, max_length=MAX_ORDERS)
    mechanism: str | Mechanism | None = None
    weight: Weight = 1.0
    timeout: Timeout | None = None
    klass: str = Field("", alias="class", max_length=256)
    team: Name | None = None

    @field_validator("blocks")
    @classmethod
    def _distinct_blocks(cls, blocks: list[str] | LastBlocks) -> list[str] | LastBlocks:
        if isinstance(blocks, list):
            if not blocks:
                raise ValueError("asks for no block")
            if len(set(blocks)) != len(blocks):
                raise ValueError("lists a block twice")
        return blocks

    @field_validator("klass")
    @classmethod
    def _printable_class(cls, klass: str) -> str:
        if printable(klass) != klass:
            raise ValueError("a class name must not contain control characters")
        return klass

    @field_validator("mechanism", mode="before")
    @classmethod
    def _known_mechanism(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in MECHANISM_NAMES:
            raise ValueError(
                f"unknown mechanism {value!r} (expected {' or '.join(map(repr, MECHANISM_NAMES))}, or a mechanism description object)"
            )
        if isinstance(value, dict):
            return parse_mechanism(value)
        return value


class Trace(_Entry):
    """A complete workload. Build one with :func:`parse_trace` (or :func:`load_trace`), which
    validates it and compiles it for the simulator."""

    accounting: Literal["basic", "rdp"]
    alphas: list[bounded(1.0, MAX_ORDER, low_open=True)] | None = Field(None, max_length=MAX_ORDERS)  # type: ignore[valid-type]
    blocks: list[TraceBlock]
    pipelines: list[TracePipeline]
    quotas: dict[Name, QuotaShare] | None = None
    _instance: Instance | None = PrivateAttr(None)

    @property
    def instance(self) -> Instance:
        """The compiled arrays the simulator runs on (computed once)."""
        if self._instance is None:
            from privsched.simulation.compile import compile_trace

            self._instance = compile_trace(self)
        return self._instance

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=False)


def _entry_name(data: Any, loc: tuple) -> str:
    """``pipelines[3] 'p3'`` for a location inside a list of entries, else the dotted path."""
    if len(loc) >= 2 and loc[0] in ("blocks", "pipelines") and isinstance(loc[1], int):
        name = f"{loc[0]}[{loc[1]}]"
        try:
            entry_id = data[loc[0]][loc[1]].get("id")
        except (AttributeError, IndexError, KeyError, TypeError):
            entry_id = None
        if isinstance(entry_id, str):
            name += f" {entry_id!r}"
        rest = [str(part) for part in loc[2:] if not str(part).startswith(("function-", "tagged-union"))]
        return name + (f": {'.'.join(rest)}" if rest else "")
    return ".".join(str(part) for part in loc) or "trace"


def parse_trace(data: Any) -> Trace:
    """Validate and compile a trace document (a dict); raise :class:`TraceError` on the first problem."""
    if not isinstance(data, dict):
        raise TraceError("a trace must be a JSON object with 'accounting', 'blocks' and 'pipelines'")
    try:
        check_depth(data, "invalid trace")
        trace = Trace.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise TraceError(f"invalid trace: {_entry_name(data, tuple(first['loc']))}: {message}{more}") from None
    except ValueError as exc:  # nested too deep
        raise TraceError(str(exc)) from None
    trace.instance  # compiling checks cross-references and demands  # noqa: B018
    return trace


def load_trace(path: str | Path) -> Trace:
    """Read (strictly, at most ``MAX_TRACE_BYTES``: :mod:`privsched.documents`), validate and
    compile a trace file."""
    try:
        data = parse_json(read_text(path, MAX_TRACE_BYTES), f"trace {str(path)!r}")
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    return parse_trace(data)


def save_trace(trace: Trace, path: str | Path) -> None:
    """Write a trace as JSON, atomically (a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".trace-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(trace.to_dict(), out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
