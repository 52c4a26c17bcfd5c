"""Pipeline specifications: what a user submits, as a pydantic model loaded from YAML or JSON.

A specification names the dataset and the blocks a pipeline reads (explicit keys, the
``last`` k blocks, or a key range), its privacy demand (``epsilon``/``delta``, an explicit
``mechanism`` description, or derived from a built-in job's training plan), the job itself
(a built-in trainer ``kind`` or user code ``function: module:qualname``), the compute it
needs, and its timeouts. Unknown fields and impossible values are errors (docs/design.md §4.4).

Example (YAML)::

    name: sentiment-lstm
    dataset: reviews
    blocks: {last: 10}            # or [2026-01-01, 2026-01-02] or {from: 2026-01-01, to: 2026-01-31}
    epsilon: 1.0                  # or a range [0.5, 2.0]: granted any amount in it (elastic)
    delta: 1.0e-9
    job: {function: mypkg.train:main, params: {lr: 0.1}}
    resources: {gpus: 1, cpus: 2, memory: 4GiB}
    timeout: 1h                   # longest wait for a grant
    max_runtime: 30m              # longest run once started (the job is killed after)
"""

from __future__ import annotations

import math
import os
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from privsched.budgets.bounds import MAX_EPSILON, MIN_EPSILON, check_number, shown
from privsched.budgets.fields import Delta, bounded
from privsched.documents import check_depth
from privsched.errors import validation_message
from privsched.spec_files import MAX_SPEC_BYTES as MAX_SPEC_BYTES, SpecError, read_spec
from privsched.text import name_problem


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_MEMORY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_MEMORY_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

#: Shortest and longest duration (timeouts, run times, ticks): 1 ms to 10 years, in seconds.
MIN_DURATION, MAX_DURATION = 0.001, 10 * 365 * 86400.0
#: Largest memory size, in bytes (1 PiB).
MAX_MEMORY = 2**50
#: Most GPUs and CPUs a job (or a pool) may have; the smallest CPU share of one job.
MAX_GPUS, MAX_CPUS, MIN_CPUS = 1024, 4096.0, 0.01
#: Most data-parallel CPU processes (``resources.workers``) one DP-SGD job may ask for.
MAX_WORKERS = 64
#: Most blocks a ``last`` selector may ask for.
MAX_LAST = 10**6
#: Largest weight of a pipeline (and smallest).
MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as ``"90"``, ``"30s"``, ``"5m"``, ``"2h"``, ``"1d"``."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"invalid duration {shown(value)} (expected seconds or e.g. 30s, 5m, 2h, 1d)")
        value = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    return float(check_number(value, "a duration in seconds (1 ms to 10 years)", MIN_DURATION, MAX_DURATION))


def parse_memory(value: Any) -> int:
    """Bytes from a number of bytes or a string such as ``"512M"``, ``"4GiB"``, ``"2G"`` (binary units)."""
    if isinstance(value, str):
        match = _MEMORY.match(value)
        if match is None:
            raise ValueError(f"invalid memory size {shown(value)} (expected bytes or e.g. 512M, 4GiB)")
        unit = (match.group(2) or "").upper().rstrip("B").rstrip("I") or ""
        value = float(match.group(1)) * _MEMORY_UNITS[unit or "B"]
    if isinstance(value, float) and math.isfinite(value):
        value = math.floor(value)
    return int(check_number(value, "a memory size (bytes)", 0, MAX_MEMORY, integer=True))


def _name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def parse_epsilon(value: Any) -> float | tuple[float, float]:
    """An ε, or an elastic range ``[min, max]`` of ε (docs/design.md §10) as a pair; a range
    whose ends are equal is that ε."""
    if not isinstance(value, (list, tuple)):
        return float(check_number(value, "", MIN_EPSILON, MAX_EPSILON))
    if len(value) != 2:
        raise ValueError(f"an epsilon range is [min, max], got {len(value)} values")
    low, high = (float(check_number(v, "each end of the range", MIN_EPSILON, MAX_EPSILON)) for v in value)
    if low > high:
        raise ValueError(f"epsilon range [{low:g}, {high:g}] is empty: its min is above its max")
    return high if low == high else (low, high)


Duration = Annotated[float, BeforeValidator(parse_duration)]
#: A fixed ε or an elastic range of ε (:func:`parse_epsilon`).
EpsilonDemand = Annotated[Union[float, tuple[float, float]], BeforeValidator(parse_epsilon)]
Memory = Annotated[int, BeforeValidator(parse_memory)]
#: A dataset, pipeline, block key or owner name (:func:`privsched.text.name_problem`).
Name = Annotated[str, AfterValidator(_name)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Last(_Model):
    """The ``last`` k active blocks of the dataset, in the order they were added."""

    last: bounded(1, MAX_LAST, integer=True)  # type: ignore[valid-type]

    def __init__(self, last: int | None = None, /, **data: Any) -> None:
        if last is not None:
            data["last"] = last
        super().__init__(**data)

    def select(self, keys: list[str]) -> list[str]:
        """Pick from the dataset's active block keys (in order of addition)."""
        if len(keys) < self.last:
            raise SpecError(f"the dataset has {len(keys)} active blocks, the pipeline asks for the last {self.last}")
        return keys[-self.last :]


class Range(_Model):
    """Every block whose key lies in ``[from, to]`` (string order: ISO dates sort correctly).
    Either bound may be left out."""

    start: Name | None = Field(None, alias="from")
    end: Name | None = Field(None, alias="to")

    def __init__(self, start: str | None = None, end: str | None = None, /, **data: Any) -> None:
        if start is not None:
            data["from"] = start
        if end is not None:
            data["to"] = end
        super().__init__(**data)

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.start is None and self.end is None:
            raise ValueError("a block range needs 'from', 'to' or both")
        if self.start is not None and self.end is not None and self.start > self.end:
            raise ValueError(f"block range is empty: from {self.start!r} is after to {self.end!r}")
        return self

    def select(self, keys: list[str]) -> list[str]:
        return [k for k in keys if (self.start is None or k >= self.start) and (self.end is None or k <= self.end)]


def _selector(value: Any) -> Any:
    """Dispatch a block selector on its shape, so that errors name the intended form."""
    if isinstance(value, dict):
        # YAML reads an unquoted 2026-01-01 as a date: keys are strings.
        value = {k: v.isoformat() if isinstance(v, date) else v for k, v in value.items()}
        model = Last if "last" in value else Range
        try:
            return model.model_validate(value)
        except ValidationError as exc:
            raise ValueError(validation_message(exc)) from None
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("the list of block keys is empty")
        # YAML reads unquoted keys such as 2026-01-01 or 17 as dates and numbers.
        keys = [
            v.isoformat() if isinstance(v, date) else str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for v in value
        ]
        for key in keys:
            problem = name_problem(key) if isinstance(key, str) else "must be a string"
            if problem is not None:
                raise ValueError(f"block key {shown(key)} {problem}")
        return keys
    if isinstance(value, (Last, Range)):
        return value
    raise ValueError("expected a list of block keys, {last: k}, or {from: KEY, to: KEY}")


BlockSelector = Annotated[Union[list[str], Last, Range], BeforeValidator(_selector)]


def select_blocks(selector: BlockSelector, keys: list[str], active_keys: list[str]) -> list[str]:
    """The block keys a selector picks from a dataset's blocks (all keys, and the active ones,
    each in order of addition). Explicit keys are returned as given, for the ledger to check."""
    if isinstance(selector, Last):
        chosen = selector.select(active_keys)
    elif isinstance(selector, Range):
        chosen = selector.select(keys)
    else:
        if len(set(selector)) != len(selector):
            raise SpecError("a block key is listed twice")
        chosen = list(selector)
    if not chosen:
        raise SpecError("no block of the dataset matches the pipeline's blocks")
    return chosen


class JobSpec(_Model):
    """The job a granted pipeline runs: a built-in trainer ``kind``, or user code ``function``
    (``module:qualname``, or ``path/to/file.py:function``), with its keyword ``params``."""

    kind: Name | None = None
    function: str | None = Field(None, min_length=1, max_length=4096)
    # Factories written in Python: pydantic reads each factory's signature, and a builtin's
    # (``dict``, ``list``) is parsed from its text by the tokenizer, whose compiled pattern
    # costs about 2 ms a process (benchmarks/README.md, issue 16).
    params: dict[str, Any] = Field(default_factory=lambda: {})
    #: Directories prepended to the job process's import path (where ``function`` lives).
    pythonpath: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(default_factory=lambda: [], max_length=64)
    #: Whether the job asks to keep TCP access in its sandbox (granted only if the operator
    #: serves with ``--allow-network``).
    network: bool = False

    @model_validator(mode="after")
    def _one_entry(self) -> JobSpec:
        if (self.kind is None) == (self.function is None):
            raise ValueError("a job needs exactly one of 'kind' (a built-in trainer) or 'function' (module:function)")
        if self.function is not None:
            module, sep, attr = self.function.rpartition(":")
            if not sep or not module or not attr:
                raise ValueError(f"job function {self.function!r} must look like 'module:function'")
        return self


class Resources(_Model):
    """Compute a job needs while it runs."""

    gpus: bounded(0, MAX_GPUS, integer=True) = 0  # type: ignore[valid-type]
    cpus: bounded(MIN_CPUS, MAX_CPUS) = 1.0  # type: ignore[valid-type]
    memory: Memory = 0  # bytes
    #: Data-parallel DP-SGD processes on CPUs (one per GPU when ``gpus`` > 1 instead).
    workers: bounded(1, MAX_WORKERS, integer=True) = 1  # type: ignore[valid-type]

    @model_validator(mode="after")
    def _one_process_count(self) -> Resources:
        if self.workers > 1 and self.gpus > 1 and self.workers != self.gpus:
            raise ValueError(f"'workers' ({self.workers}) must equal 'gpus' ({self.gpus}): one process per GPU")
        return self

    @property
    def processes(self) -> int:
        """A DP-SGD job's data-parallel processes: one per GPU, else its ``workers`` (any
        other job runs as one process, whatever its GPUs)."""
        return max(self.gpus, self.workers)

    @property
    def held_cpus(self) -> float:
        """The CPUs the job holds: its ``cpus``, and at least one per CPU worker of a
        data-parallel job (a job of one process holds its ``cpus``, a fraction of one too)."""
        return max(self.cpus, float(self.workers)) if self.workers > 1 else self.cpus

    def describe(self) -> str:
        memory = f", {self.memory / 2**30:.3g} GiB" if self.memory else ""
        workers = f", {self.workers} workers" if self.workers > 1 else ""
        return f"{self.gpus} GPU(s), {self.held_cpus:g} CPU(s){memory}{workers}"


class Accuracy(_Model):
    """What a statistic's answer must meet: every bin within ±``alpha`` of the truth with
    probability at least 1 − ``beta`` (docs/privacy.md, "Answers from a cached histogram")."""

    alpha: bounded(0.0, 1e15, low_open=True)  # type: ignore[valid-type]
    beta: bounded(1e-12, 0.5)  # type: ignore[valid-type]


class PipelineSpec(_Model):
    """A pipeline as submitted: data, privacy demand, job, compute and timeouts."""

    name: Name
    dataset: Name
    blocks: BlockSelector
    #: ε, or a range (min, max): the pipeline accepts any grant in it (docs/design.md §10).
    epsilon: EpsilonDemand | None = None
    delta: Delta | None = None
    #: A mechanism description (privsched.budgets.mechanisms), e.g. {kind: laplace, scale: 10}.
    mechanism: dict[str, Any] | None = None
    job: JobSpec
    resources: Resources = Field(default_factory=Resources)
    #: Longest wait for a grant, in seconds after submission (docs/design.md §4.4); None waits forever.
    timeout: Duration | None = None
    #: Longest run once the job has started; the job is killed and failed after it.
    max_runtime: Duration | None = None
    weight: bounded(MIN_WEIGHT, MAX_WEIGHT) = 1.0  # type: ignore[valid-type]
    #: Defaults to the submitting user.
    owner: Name | None = None
    #: A statistic already released on the same blocks is returned again at no charge
    #: (docs/privacy.md, "Reuse of released results"); false runs it and pays.
    reuse: bool = True
    #: A statistic's accuracy; its ε is derived from it (``epsilon``, if given, is the cap).
    accuracy: Accuracy | None = None

    @model_validator(mode="after")
    def _one_demand(self) -> PipelineSpec:
        if self.mechanism is not None and (self.epsilon is not None or self.delta is not None):
            raise ValueError("give either 'epsilon'/'delta' or a 'mechanism', not both")
        if self.accuracy is not None and self.job.kind != "statistic":
            raise ValueError("'accuracy' is for a built-in statistic (job kind statistic)")
        if self.accuracy is not None and isinstance(self.epsilon, tuple):
            raise ValueError("with 'accuracy', 'epsilon' is a single cap, not a range")
        if self.delta is not None and self.epsilon is None:
            raise ValueError("'delta' needs 'epsilon'")
        if self.mechanism is None and self.epsilon is None and self.accuracy is None:
            raise ValueError("the pipeline has no privacy demand: give 'epsilon' (and 'delta') or a 'mechanism'")
        return self

    @property
    def epsilon_max(self) -> float | None:
        """The ε the pipeline asks for at most (its demand): the range's max, or its ε."""
        return self.epsilon[1] if isinstance(self.epsilon, tuple) else self.epsilon

    @property
    def epsilon_min(self) -> float | None:
        """The least ε the pipeline accepts: the range's min, or its ε."""
        return self.epsilon[0] if isinstance(self.epsilon, tuple) else self.epsilon

    @property
    def elastic(self) -> bool:
        """Whether the pipeline asks for a range of ε."""
        return isinstance(self.epsilon, tuple)

    @model_validator(mode="after")
    def _data_parallel_trains(self) -> PipelineSpec:
        if self.resources.workers > 1 and self.job.kind != "dpsgd":
            raise ValueError("'workers' trains data-parallel DP-SGD only: give 'job: {kind: dpsgd}' or ask for one worker")
        return self

    @classmethod
    def parse(cls, data: Any, source: str = "pipeline") -> PipelineSpec:
        """Validate a mapping; any problem raises :class:`SpecError` with one line."""
        if not isinstance(data, dict):
            raise SpecError(f"{source}: a pipeline specification must be a mapping, got {type(data).__name__}")
        try:
            check_depth(data, source)
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(f"{source}: {validation_message(exc)}") from None
        except ValueError as exc:  # nesting too deep
            raise SpecError(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping that :meth:`parse` turns back into an equal specification."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def load_spec(path: str | os.PathLike) -> PipelineSpec:
    """Load and validate a specification file (:func:`read_spec`)."""
    return PipelineSpec.parse(read_spec(path), source=str(Path(path)))
