"""Checks of caller input, each raising :class:`LedgerError` with a one-line reason."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from privsched.ledger.errors import LedgerError
from privsched.text import name_problem

if TYPE_CHECKING:
    import numpy as np

    from privsched.budgets.accounting import Accounting
    from privsched.ledger.models import PipelineRequest


def name(value: object, what: str) -> str:
    """A non-empty single-line name (dataset, block key, pipeline, owner) without control
    characters and at most ``MAX_NAME_LENGTH`` long (:func:`privsched.text.name_problem`)."""
    problem = name_problem(value)
    if problem is not None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise LedgerError(f"{what} {shown} {problem}")
    return value  # type: ignore[return-value]


def failure_message(value: object) -> str:
    """Why a job failed, as the ledger records it: any string."""
    if not isinstance(value, str):
        raise LedgerError(f"failure message must be a string, got {value!r}")
    return value


def unit(kind: object, user_column: object, k: object) -> tuple[str, str | None, int]:
    """A dataset's unit of privacy as ``(unit, user column, K)``: a person's unit names the
    column holding the person and bounds their rows in a read by an integer K ≥ 1 (default 1);
    a record's takes neither."""
    from privsched.ledger.models import UNITS

    if kind not in UNITS:
        raise LedgerError(f"unit must be one of {', '.join(UNITS)}, got {kind!r}")
    if kind == "record":
        if user_column is not None or k is not None:
            raise LedgerError("--user-column and --max-rows-per-user are for --unit user or user-time, not record")
        return "record", None, 1
    if user_column is None:
        raise LedgerError(f"--unit {kind} needs --user-column, the column naming the person")
    column = name(user_column, "user column")
    if k is None:
        return str(kind), column, 1
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise LedgerError(f"--max-rows-per-user must be an integer of at least 1, got {k!r}")
    return str(kind), column, k


def location(text: str, key: str) -> str:
    """A block's data location: an existing file, or a folder, that this process may read
    (and list), as an absolute path (a relative one is taken from the current folder).
    Through a server this process is the service that later hands the location to jobs."""
    shown = repr(text) if len(text) <= 200 else repr(text[:197] + "...")
    try:
        info = os.stat(text)
    except FileNotFoundError:
        raise LedgerError(f"the data location of block {key!r} does not exist: {shown}") from None
    except (OSError, ValueError) as exc:  # a symbolic-link loop, a name too long, a NUL byte
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise LedgerError(f"the data location of block {key!r} cannot be used: {shown} ({why})") from None
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise LedgerError(f"the data location of block {key!r} is neither a file nor a folder: {shown}")
    needed = os.R_OK | (os.X_OK if stat.S_ISDIR(info.st_mode) else 0)
    if not os.access(text, needed):
        raise LedgerError(f"the data location of block {key!r} is not readable by privsched: {shown}")
    return os.path.abspath(text)


def unique(values: Iterable[str], what: str) -> list[str]:
    values = list(values)
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise LedgerError(f"duplicate {what} {value!r}")
        seen.add(value)
    return values


def _numpy_types(*kinds: str) -> tuple[type, ...]:
    """NumPy's scalar types ``kinds`` (``"integer"``, ``"floating"``), or none while NumPy is
    not loaded (no value can be one then; reading the ledger does not load it)."""
    numpy = sys.modules.get("numpy")
    return () if numpy is None else tuple(getattr(numpy, kind) for kind in kinds)


def finite_number(value: object, what: str, *, low: float = 0.0, high: float = math.inf, low_open: bool = False) -> float:
    """A finite float in [low, high] (or (low, high] with ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, *_numpy_types("integer", "floating"))):
        raise LedgerError(f"{what} must be a number, got {value!r}")
    number = float(value)  # type: ignore[arg-type]  # a number, checked above
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        bound = "(" if low_open else "["
        raise LedgerError(f"{what} must be finite and in {bound}{low:g}, {high:g}], got {value!r}")
    return number


def elastic_min(value: object) -> float | None:
    """The least fraction of its demand a pipeline accepts, in (0, 1]; None (and 1) for a fixed demand."""
    if value is None:
        return None
    fraction = finite_number(value, "elastic_min", high=1.0, low_open=True)
    return None if fraction == 1.0 else fraction


def vector(value: object, dims: int, what: str) -> np.ndarray:
    """A finite, non-negative budget vector of length ``dims``."""
    import numpy as np

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


#: Largest database id: SQLite's rowid is a signed 64-bit integer.
MAX_ID = 2**63 - 1


def ids(values: Iterable[int], what: str = "pipeline id") -> list[int]:
    """Database ids given by a caller, as Python ints in [1, MAX_ID]."""
    out = []
    integers = (int, *_numpy_types("integer"))
    for value in values:
        if isinstance(value, bool) or not isinstance(value, integers):
            raise LedgerError(f"{what} must be an integer, got {value!r}")
        if not 1 <= value <= MAX_ID:
            text = str(value) if len(str(value)) <= 40 else str(value)[:37] + "..."
            raise LedgerError(f"{what} must be in [1, {MAX_ID}] (a 64-bit id), got {text}")
        out.append(int(value))
    return out


#: Largest JSON text stored for a pipeline's job, resources or mechanism, in bytes.
MAX_STORED_JSON = 2**20


def json_text(value: Any, what: str) -> str:
    """A dict as JSON text (no NaN), at most ``MAX_STORED_JSON`` bytes."""
    if not isinstance(value, dict):
        raise LedgerError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        text = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        raise LedgerError(f"{what} is not JSON-serialisable: {exc}") from exc
    if len(text.encode()) > MAX_STORED_JSON:
        raise LedgerError(f"{what} is {len(text.encode())} bytes as JSON, more than the {MAX_STORED_JSON}-byte limit")
    return text


def accounting_mode(accounting: str, alphas: Sequence[float] | None) -> Accounting:
    """The accounting mode a dataset asks for."""
    from privsched.budgets.accounting import Accounting

    if accounting not in ("basic", "rdp"):
        raise LedgerError(f"unknown accounting {accounting!r} (expected 'basic' or 'rdp')")
    if accounting == "basic":
        if alphas:
            raise LedgerError("basic accounting takes no RDP orders")
        return Accounting.basic()
    try:
        return Accounting.rdp(None if alphas is None else [float(a) for a in alphas])
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"invalid RDP orders: {exc}") from exc


def positive(demand: np.ndarray, accounting: Accounting, capacity: np.ndarray, what: str) -> np.ndarray:
    """A demand that charges something wherever budget is counted: ε > 0 under basic
    composition (δ may be 0: pure DP), d(α) > 0 at every live order under RDP. A zero
    order would let a pipeline be granted there for free (docs/design.md §3.3: one fitting order
    suffices), so it would read the data without spending budget."""
    import numpy as np

    counted = accounting.live(capacity) if accounting.is_rdp else np.array([True, False])
    free = counted & ~(demand > 0)
    if free.any():
        where = ", ".join(label for label, bad in zip(accounting.dimension_labels(), free) if bad)
        raise LedgerError(f"{what} must be positive at every live order, but is {demand[free].tolist()} at {where}")
    return demand


def request_demands(request: PipelineRequest, accounting: Accounting, capacity: np.ndarray) -> dict[str, np.ndarray]:
    """The per-block demand vectors of a request, validated (``capacity``: every block's
    capacity in the dataset, which says which orders are live)."""
    import numpy as np

    if request.mechanism is not None:
        if not isinstance(request.mechanism, str):
            raise LedgerError("mechanism must be a JSON string")
        if len(request.mechanism.encode()) > MAX_STORED_JSON:
            raise LedgerError(f"mechanism is more than the {MAX_STORED_JSON}-byte limit")
        try:
            json.loads(request.mechanism)
        except (ValueError, RecursionError) as exc:
            raise LedgerError(f"mechanism is not valid JSON: {exc}") from exc
    keys = [name(k, "block key") for k in (request.block_keys or [])]
    unique(keys, "block key")
    if request.demand is not None and request.demands is not None:
        raise LedgerError("give either demand (every block) or demands (per block), not both")
    if request.demands is not None:
        given = dict(request.demands)
        if not keys:
            keys = [name(k, "block key") for k in given]
        if set(given) != set(keys):
            raise LedgerError(f"demands are for blocks {sorted(given)}, but the request names {sorted(keys)}")
        vectors = {
            k: positive(vector(given[k], accounting.dims, f"demand on block {k!r}"), accounting, capacity, f"demand on block {k!r}")
            for k in keys
        }
    else:
        if request.demand is not None:
            demand = vector(request.demand, accounting.dims, "demand")
        elif request.mechanism is not None:
            try:
                demand = mechanism_demand(request.mechanism, accounting)
            except ValueError as exc:
                raise LedgerError(f"invalid mechanism: {exc}") from exc
            demand = vector(demand, accounting.dims, "mechanism demand")
        else:
            raise LedgerError("a pipeline needs a demand, per-block demands, or a mechanism")
        positive(demand, accounting, capacity, "demand")
        vectors = {k: demand for k in keys}
    if not vectors:
        raise LedgerError(f"pipeline {request.name!r} requests no blocks")
    if request.mechanism is not None and (request.demand is not None or request.demands is not None):
        curve = mechanism_curve(request.mechanism, accounting)
        for key, demand in vectors.items():
            if not np.all(demand >= curve):
                raise LedgerError(f"demand on block {key!r} is below the curve of its mechanism {request.mechanism}")
    return vectors


def mechanism_demand(mechanism: str, accounting: Accounting) -> np.ndarray:
    """The curve of a mechanism's JSON description (``ValueError`` if it is invalid). The
    mechanisms' models are imported here, on a write, not by a command that only reads."""
    from privsched.budgets.mechanisms import demand_vector, parse_mechanism

    return demand_vector(parse_mechanism(mechanism), accounting)


def mechanism_curve(mechanism: str, accounting: Accounting) -> np.ndarray:
    """The demand vector of a stored mechanism description: a stored demand must be at
    least this, or what the ledger charges is not what the job releases."""
    try:
        return vector(mechanism_demand(mechanism, accounting), accounting.dims, "mechanism demand")
    except ValueError as exc:
        raise LedgerError(f"invalid mechanism: {exc}") from exc


def spent_per_block(spent: np.ndarray | Mapping[str, np.ndarray], keys: list[str], accounting: Accounting) -> dict[str, np.ndarray]:
    """What a job reports it spent, one vector per block of its grant."""
    if isinstance(spent, Mapping):
        extra = set(spent) - set(keys)
        if extra:
            raise LedgerError(f"spent budget names blocks outside the grant: {sorted(extra)}")
        missing = set(keys) - set(spent)
        if missing:
            raise LedgerError(f"spent budget is missing blocks {sorted(missing)}")
        return {k: vector(spent[k], accounting.dims, f"spent budget on block {k!r}") for k in keys}
    same = vector(spent, accounting.dims, "spent budget")
    return {k: same for k in keys}
