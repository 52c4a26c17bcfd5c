"""Trace files: a whole workload (blocks and pipelines) as one JSON document.

A trace is validated entry by entry; every problem is reported as one :class:`TraceError`
line naming the offending entry (``pipelines[3] 'p3': ...``). Loading a trace also compiles
it (:func:`privsched.simulation.instance.compile_trace`), so a trace that loads is one the
simulator can run. Saving writes to a temporary file renamed into place: a failed save
leaves no partial file behind.

Format (times in seconds)::

    {"accounting": "basic" | "rdp", "alphas": [...],
     "blocks": [{"id": "b0", "arrival": 0.0, "epsilon": 1.0, "delta": 1e-6}, ...],
     "pipelines": [{"id": "p0", "arrival": 1.0, "blocks": ["b0"] | {"last": 10},
                    "epsilon": 0.01, "delta": 1e-9, "demands": {"b0": 0.5},
                    "curve": [...], "mechanism": "gaussian" | {...},
                    "weight": 1, "timeout": 300, "class": "mice"}, ...]}
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from privsched.budgets.mechanisms import Mechanism, parse_mechanism
from privsched.errors import BadInput

if TYPE_CHECKING:
    from privsched.simulation.instance import Instance

#: Mechanisms a pipeline may name with a string; they are calibrated to its (ε, δ).
MECHANISM_NAMES = ("gaussian", "laplace")


class TraceError(BadInput):
    """A trace that cannot be simulated; the message names the offending entry."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class TraceBlock(_Entry):
    """A block: it exists from ``arrival`` on, with global budget (ε_G, δ_G)."""

    id: str = Field(min_length=1)
    arrival: float = Field(0.0, allow_inf_nan=False)
    epsilon: PositiveFloat = Field(allow_inf_nan=False)
    delta: float = Field(0.0, ge=0, lt=1)


class LastBlocks(_Entry):
    """The ``last`` k blocks that exist when the pipeline arrives."""

    last: PositiveInt


class TracePipeline(_Entry):
    """A pipeline: its blocks, its demand (one of epsilon/demands/curve/mechanism), weight and timeout."""

    id: str = Field(min_length=1)
    arrival: float = Field(allow_inf_nan=False)
    blocks: list[str] | LastBlocks
    epsilon: PositiveFloat | None = Field(None, allow_inf_nan=False)
    delta: float = Field(0.0, ge=0, lt=1)
    demands: dict[str, PositiveFloat] | None = None
    curve: list[float] | None = None
    mechanism: str | Mechanism | None = None
    weight: PositiveFloat = Field(1.0, allow_inf_nan=False)
    timeout: PositiveFloat | None = None
    klass: str = Field("", alias="class")

    @field_validator("blocks")
    @classmethod
    def _distinct_blocks(cls, blocks: list[str] | LastBlocks) -> list[str] | LastBlocks:
        if isinstance(blocks, list):
            if not blocks:
                raise ValueError("asks for no block")
            if len(set(blocks)) != len(blocks):
                raise ValueError("lists a block twice")
        return blocks

    @field_validator("curve")
    @classmethod
    def _finite_curve(cls, curve: list[float] | None) -> list[float] | None:
        if curve is not None and not all(math.isfinite(v) and v >= 0 for v in curve):
            raise ValueError("curve values must be finite and non-negative")
        return curve

    @field_validator("mechanism", mode="before")
    @classmethod
    def _known_mechanism(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in MECHANISM_NAMES:
            raise ValueError(
                f"unknown mechanism {value!r} (expected {' or '.join(map(repr, MECHANISM_NAMES))}, "
                "or a mechanism description object)"
            )
        if isinstance(value, dict):
            return parse_mechanism(value)
        return value


class Trace(_Entry):
    """A complete workload. Build one with :func:`parse_trace` (or :func:`load_trace`), which
    validates it and compiles it for the simulator."""

    accounting: Literal["basic", "rdp"]
    alphas: list[float] | None = None
    blocks: list[TraceBlock]
    pipelines: list[TracePipeline]
    _instance: Instance | None = PrivateAttr(None)

    @property
    def instance(self) -> Instance:
        """The compiled arrays the simulator runs on (computed once)."""
        if self._instance is None:
            from privsched.simulation.instance import compile_trace

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
        trace = Trace.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise TraceError(f"invalid trace: {_entry_name(data, tuple(first['loc']))}: {message}{more}") from None
    trace.instance  # compiling checks cross-references and demands  # noqa: B018
    return trace


def load_trace(path: str | Path) -> Trace:
    """Read, validate and compile a trace file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"malformed JSON in {str(path)!r}: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
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
