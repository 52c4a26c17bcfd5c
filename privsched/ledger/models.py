"""Plain data the ledger takes and returns. Budget vectors are float arrays of length K
(``accounting.dims``): (ε, δ) under basic composition, one ε(α) per order under RDP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privsched.budgets.accounting import Accounting

#: Pipeline life cycle states (DESIGN §4.4).
PIPELINE_STATES = ("pending", "granted", "running", "completed", "failed", "timed_out", "cancelled")
#: States whose pipeline holds an allocation.
HOLDING_STATES = ("granted", "running")
#: Balance buckets of a block; ``capacity = locked + unlocked + allocated + consumed``.
BUCKETS = ("locked", "unlocked", "allocated", "consumed")


@dataclass(frozen=True, eq=False)
class DatasetInfo:
    name: str
    accounting: Accounting
    epsilon: float
    delta: float
    conversion: str
    capacity: np.ndarray  # (K,) every block's capacity
    created_at: float
    id: int = 0


@dataclass(frozen=True)
class BlockSpec:
    """A block to add: its key (a date, a user range, ...) and where its data lives."""

    key: str
    location: str | None = None


@dataclass(frozen=True, eq=False)
class BlockInfo:
    id: int
    dataset: str
    key: str
    location: str | None
    state: str  # "active" | "retired"
    created_at: float
    capacity: np.ndarray
    locked: np.ndarray
    unlocked: np.ndarray  # RDP: may be < 0 at some orders (DESIGN §3.3)
    allocated: np.ndarray
    consumed: np.ndarray

    @property
    def remaining(self) -> np.ndarray:
        """Budget not yet given out: capacity − allocated − consumed (= locked + unlocked)."""
        return self.capacity - self.allocated - self.consumed


@dataclass
class PipelineRequest:
    """A claim: a demand on a set of blocks of one dataset, granted all-or-nothing.

    Give ``demand`` (one vector for every block), or ``demands`` (one per block key), or
    neither and a ``mechanism`` JSON description from which the demand is computed.
    """

    name: str
    dataset: str
    block_keys: list[str] = field(default_factory=list)
    demand: np.ndarray | None = None
    demands: dict[str, np.ndarray] | None = None
    mechanism: str | None = None
    weight: float = 1.0
    timeout: float | None = None
    owner: str = ""
    job: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class PipelineInfo:
    id: int
    name: str
    dataset: str
    state: str
    owner: str
    weight: float
    timeout: float | None
    submitted_at: float
    granted_at: float | None
    started_at: float | None
    finished_at: float | None
    block_keys: list[str]
    demands: dict[str, np.ndarray]
    mechanism: str | None
    job: dict[str, Any]
    resources: dict[str, Any]
    placement: dict[str, Any] | None
    consumed: dict[str, np.ndarray] | None
    message: str | None


@dataclass(frozen=True, eq=False)
class PendingView:
    """The arrays of :class:`privsched.policies.base.Snapshot` for one dataset: the blocks
    (active ones, plus any retired block a pending pipeline still asks for) and the pending
    pipelines with their per-block demands as edges, grouped by pipeline in id order.
    Edge indices point into these arrays, not at database ids."""

    block_ids: np.ndarray  # (B,) int database ids
    capacity: np.ndarray  # (B, K)
    unlocked: np.ndarray  # (B, K)
    pipeline_ids: np.ndarray  # (P,) int database ids
    arrival: np.ndarray  # (P,) submission times
    weight: np.ndarray  # (P,)
    edge_pipeline: np.ndarray  # (E,) index into pipeline_ids
    edge_block: np.ndarray  # (E,) index into block_ids
    edge_demand: np.ndarray  # (E, K)
    accounting: Accounting | None = None


@dataclass(frozen=True, eq=False)
class Event:
    """One row of the append-only log. With an ``amount`` it moves budget of ``block_id``
    from bucket ``source`` to bucket ``target`` (``source`` None: new capacity); without,
    it moves a pipeline or block from state ``source`` to state ``target``. ``detail`` is the
    canonical JSON a creation or submission recorded (definition, key, demands)."""

    id: int
    at: float
    kind: str
    dataset_id: int | None
    block_id: int | None
    pipeline_id: int | None
    source: str | None
    target: str | None
    amount: np.ndarray | None
    reason: str | None
    detail: str | None = None


@dataclass(frozen=True)
class AuditReport:
    ok: bool
    violations: list[str]
    blocks: int = 0
    events: int = 0
    head: str = ""  # the event log's chain head, ``<event id>:<hex SHA-256>``
