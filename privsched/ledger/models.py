"""Plain data the ledger takes and returns. Budget vectors are float arrays of length K
(``accounting.dims``): (ε, δ) under basic composition, one ε(α) per order under RDP."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from privsched.ledger.states import PipelineState
from privsched.ledger.vectors import decoded_on_read

if TYPE_CHECKING:
    import numpy as np

    from privsched.budgets.accounting import Accounting

#: Pipeline life cycle states (docs/design.md §4.4), as stored in the database.
PIPELINE_STATES = tuple(state.value for state in PipelineState)
#: States whose pipeline holds an allocation.
HOLDING_STATES = tuple(state.value for state in PipelineState if state.holds_allocation())
#: Balance buckets of a block; ``capacity = locked + unlocked + allocated + consumed``.
BUCKETS = ("locked", "unlocked", "allocated", "consumed")
#: The actor of an event caused through the database file itself (no server): its operator.
OPERATOR = "operator"
#: SHA-256 of no bytes at all: the fingerprint of an empty file or folder, which holds no
#: records and is exempt from the rule that the same data never gets two budgets.
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#: The actor of an event a scheduler caused (a ledger holding the scheduler lease).
SCHEDULER = "scheduler"


@decoded_on_read("capacity")
@dataclass(frozen=True, eq=False)
class DatasetInfo:
    """A dataset as the ledger records it (docs/design.md §2, §3.2)."""

    name: str  # unique name
    accounting: Accounting  # basic (ε, δ) or RDP with its orders
    epsilon: float  # ε_G, every block's global ε
    delta: float  # δ_G, every block's global δ
    conversion: str  # RDP capacity rule: "paper" (OSDI'21) or "tight" (CKS'20)
    capacity: np.ndarray  # (K,) every block's capacity
    created_at: float  # seconds since the epoch
    id: int = 0  # database id
    unit: str = "record"  # what one block budget protects: a record, a person ("user") or a person in one period ("user-time")
    user_column: str | None = None  # the column naming the person (user units)
    max_rows_per_user: int = 1  # K: rows of one person any read returns (user units; 1 for records)

    def unit_text(self) -> str:
        """The unit of privacy in words: ``record``, or ``user (uid, K=5)``."""
        return self.unit if self.unit == "record" else f"{self.unit} ({self.user_column}, K={self.max_rows_per_user})"


#: A dataset's units of privacy (docs/privacy.md "Units"), fixed at its creation.
UNITS = ("record", "user", "user-time")


@dataclass(frozen=True)
class BlockSpec:
    """A block to add: its key (a date, a user range, ...), where its data lives, and the
    fingerprint privsched took of that data (:mod:`privsched.data.store`)."""

    key: str
    location: str | None = None
    sha256: str | None = None  # hex SHA-256 of the data (None: no data yet)
    rows: int | None = None  # records in it, when privsched wrote it (None: not counted)


@dataclass(frozen=True)
class Segment:
    """One import's rows of a user block: an immutable Parquet file ``name`` in the block's
    folder ``location``, and the folder's fingerprint once it holds the segment."""

    key: str  # the block's key
    location: str  # the block's folder
    name: str  # the segment's file name in it
    sha256: str  # hex SHA-256 of the segment's file
    rows: int  # rows in the segment
    fingerprint: str  # the folder's fingerprint with the segment (privsched.ledger.fingerprints)


@dataclass(frozen=True)
class DatasetSchema:
    """A dataset's table: its columns and their Arrow types, recorded at its first import
    and checked on every later one, and the public bounds and categories declared for some
    columns. Declared values are public by declaration (docs/design.md §9): readers of the
    dataset see them, and statistics take them as their clipping bounds by default."""

    columns: dict[str, str]  # column name -> Arrow type, in table order
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)  # column -> declared (low, high)
    categories: dict[str, list[str]] = field(default_factory=dict)  # column -> declared values

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": [[name, kind] for name, kind in self.columns.items()],
            "bounds": {name: list(pair) for name, pair in sorted(self.bounds.items())},
            "categories": {name: list(values) for name, values in sorted(self.categories.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DatasetSchema:
        return cls(
            columns={str(name): str(kind) for name, kind in data["columns"]},
            bounds={str(name): (float(pair[0]), float(pair[1])) for name, pair in data.get("bounds", {}).items()},
            categories={str(name): [str(v) for v in values] for name, values in data.get("categories", {}).items()},
        )


@decoded_on_read("capacity", "locked", "unlocked", "allocated", "consumed")
@dataclass(frozen=True, eq=False)
class BlockInfo:
    """A block and its balances, each a (K,) budget vector; at every order
    ``capacity = locked + unlocked + allocated + consumed`` (docs/design.md §2)."""

    id: int  # database id
    dataset: str  # the dataset's name
    key: str  # the block's name within its dataset (a date, a user range)
    location: str | None  # where its data lives, handed to jobs granted the block
    state: str  # "active" | "retired" (consumed up to capacity at every live order)
    created_at: float  # seconds since the epoch; per-time unlocking counts from here
    capacity: np.ndarray  # total budget
    locked: np.ndarray  # not yet offered to the scheduler
    unlocked: np.ndarray  # grantable now; RDP: may be < 0 at some orders (docs/design.md §3.3)
    allocated: np.ndarray  # granted to pipelines not yet settled
    consumed: np.ndarray  # spent for good
    sha256: str | None = None  # hex SHA-256 of its data when it was created (None: it had none)
    rows: int | None = None  # records in it, for blocks privsched imported (administrators only)

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
    #: The least fraction of the demand an elastic pipeline accepts, in (0, 1] (None: fixed).
    elastic_min: float | None = None


@dataclass(frozen=True, eq=False)
class Ending:
    """How one job ended, for :meth:`~privsched.ledger.ledger.Ledger.settle_many`: with
    ``spent`` (per block key) the pipeline completes (:meth:`~privsched.ledger.ledger.Ledger.complete`),
    without it the pipeline fails with ``message`` (:meth:`~privsched.ledger.ledger.Ledger.fail`)."""

    pipeline_id: int
    spent: Any = None  # what the job spent, per block key (None: it failed)
    message: str = "the job failed"  # why it failed
    touched_data: bool = True  # a failed job that touched data consumes its whole allocation
    actor: str | None = None  # who caused its failure (None: the ledger's own actor)


@decoded_on_read(maps=("demands", "consumed"))
@dataclass(frozen=True, eq=False)
class PipelineInfo:
    """A pipeline as the ledger records it (docs/design.md §4.4); times are seconds since
    the epoch, budgets (K,) vectors."""

    id: int  # database id, in submission order
    name: str  # the submitter's name for it
    dataset: str  # the dataset's name
    state: PipelineState  # where it is in its life cycle
    owner: str  # who submitted it
    weight: float  # profit of granting it (DPack, optimal)
    timeout: float | None  # longest wait for a grant, in seconds from submission
    submitted_at: float  # its arrival
    granted_at: float | None  # when its demand was allocated
    started_at: float | None  # when its job started
    finished_at: float | None  # when it ended (any final state)
    block_keys: list[str]  # the blocks it asked for, in request order
    demands: dict[str, np.ndarray]  # block key -> demand (allocated once granted)
    mechanism: str | None  # JSON description of the mechanism its demand is the curve of
    job: dict[str, Any]  # what to run (built-in kind or user function) and its parameters
    resources: dict[str, Any]  # compute it needs: gpus, cpus, memory
    placement: dict[str, Any] | None  # where its job was started (executor, host, GPUs)
    consumed: dict[str, np.ndarray] | None  # block key -> budget spent, once settled
    message: str | None  # why it failed or was released, if it did
    elastic_min: float | None = None  # least fraction of its demand it accepts (None: a fixed demand)
    fraction: float | None = None  # fraction of its demand it was granted (None: all of it, or not granted)

    @property
    def granted(self) -> dict[str, np.ndarray]:
        """Block key -> what a grant allocated (or allocates): its fraction of the demand."""
        from privsched.budgets.elastic import granted_amount

        return {key: granted_amount(demand, self.fraction) for key, demand in self.demands.items()}


@dataclass(frozen=True, eq=False)
class PendingBatch:
    """Pending pipelines of one dataset, in id order, and their demands as edges grouped by
    pipeline in request order."""

    pipeline_ids: np.ndarray  # (P,) int database ids, ascending
    arrival: np.ndarray  # (P,) submission times
    weight: np.ndarray  # (P,) profit of granting each (DPack, optimal)
    deadline: np.ndarray  # (P,) when each times out waiting (submission + timeout; inf: never)
    edge_pipeline: np.ndarray  # (E,) index into pipeline_ids
    edge_block: np.ndarray  # (E,) int database ids of the blocks
    edge_demand: np.ndarray  # (E, K) the demand on each
    elastic_min: np.ndarray | None = None  # (P,) least fraction of its demand each accepts (1.0; None: all fixed)

    @classmethod
    def empty(cls, dims: int) -> PendingBatch:
        """No pipeline, with budgets of ``dims`` dimensions."""
        import numpy as np

        none = np.zeros(0, dtype=np.int64)
        return cls(none, np.zeros(0), np.zeros(0), np.zeros(0), none, none, np.zeros((0, dims)))

    def minimums(self) -> np.ndarray:
        """(P,) the least fraction each pipeline accepts (1.0 for a fixed demand)."""
        import numpy as np

        return np.ones(len(self.pipeline_ids)) if self.elastic_min is None else self.elastic_min


@dataclass(frozen=True, eq=False)
class PendingView:
    """A dataset's pending pipelines and the blocks a policy may see: its active blocks, plus
    any retired block a pending pipeline still asks for. Rows by database id; the policy's
    :class:`~privsched.policies.base.Snapshot` is built from it by
    :func:`privsched.service.snapshot.snapshot_of`."""

    accounting: Accounting  # the dataset's
    block_ids: np.ndarray  # (B,) int database ids, ascending
    capacity: np.ndarray  # (B, K) each block's capacity
    unlocked: np.ndarray  # (B, K) each block's unlocked budget
    pipelines: PendingBatch  # its pending pipelines; every edge names a block of ``block_ids``


@decoded_on_read("amount")
@dataclass(frozen=True, eq=False)
class Event:
    """One row of the append-only log. With an ``amount`` it moves budget of ``block_id``
    from bucket ``source`` to bucket ``target`` (``source`` None: new capacity); without,
    it moves a pipeline or block from state ``source`` to state ``target``. ``detail`` is the
    canonical JSON a creation or submission recorded (definition, key, demands)."""

    id: int  # its place in the log, from 1
    at: float  # seconds since the epoch
    kind: str  # create, submit, unlock, grant, run, stop, complete, fail, cancel, release, expire, retire
    dataset_id: int | None
    block_id: int | None
    pipeline_id: int | None
    source: str | None  # bucket (amount given) or state it leaves
    target: str | None  # bucket (amount given) or state it enters
    amount: np.ndarray | None  # (K,) budget moved, if any
    reason: str | None  # why (a failure's message, a release's reason)
    detail: str | None = None
    actor: str | None = None  # who caused it: a user's name, OPERATOR or SCHEDULER (None: recorded before actors were)


@dataclass(frozen=True)
class AuditReport:
    """What ``Ledger.audit`` found replaying the event log (docs/design.md §6.1)."""

    ok: bool  # no violation: every balance, identity, invariant and holding checks out
    violations: list[str]  # one line per problem, naming the block or pipeline
    blocks: int = 0  # blocks checked
    events: int = 0  # events replayed
    head: str = ""  # the event log's chain head, ``<event id>:<hex SHA-256>``
