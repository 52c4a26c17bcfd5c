"""The JSON bodies of the HTTP API, shared by the server (and its OpenAPI page) and the
remote client, with conversions to and from the ledger's data classes.

Budget vectors travel as lists of floats; infinities are written as JSON's common
extension ``Infinity`` (an RDP curve may be infinite at some orders), which Python's
``json`` reads back exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from privsched.budgets.accounting import Accounting
from privsched.ledger.models import BUCKETS, BlockInfo, DatasetInfo, DatasetSchema, Event, PipelineInfo
from privsched.ledger.states import PipelineState

if TYPE_CHECKING:
    from privsched.data.importer import ImportReport
    from privsched.readouts import DatasetBalances

#: Largest request body the server reads, in bytes.
MAX_BODY = 1 << 20
#: Largest table an administrator may upload for import, in bytes.
MAX_UPLOAD = 1 << 32
#: The one route whose body is a table, not JSON: ``POST /v1/datasets/{name}/import``.
UPLOAD_SUFFIX = "/import"


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


def _vector(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=float)


class DatasetIn(Model):
    name: str
    epsilon: float
    delta: float
    accounting: Literal["basic", "rdp"] = "rdp"
    alphas: list[float] | None = None
    conversion: Literal["paper", "tight"] = "paper"
    teams: list[str] = Field(default_factory=list, description="Teams that may use it; empty: every user.")
    unit: str = Field(default="record", description="What a block's budget protects: record, user or user-time.")
    user_column: str | None = Field(default=None, description="The column naming the person (user units).")
    max_rows_per_user: int | None = Field(default=None, description="K: rows of one person any read returns (user units).")


class DatasetOut(Model):
    name: str
    accounting: str
    alphas: list[float]
    epsilon: float
    delta: float
    conversion: str
    capacity: list[float]
    created_at: float
    teams: list[str] = Field(default_factory=list)
    unit: str = "record"  # what a block's budget protects (public: part of the guarantee)
    user_column: str | None = None
    max_rows_per_user: int = 1
    #: Its table: columns and types, declared public bounds and categories (public by
    #: declaration; null until its first import, and in lists of datasets).
    table: dict[str, Any] | None = None

    @classmethod
    def of(cls, info: DatasetInfo, teams: list[str], table: DatasetSchema | None = None) -> DatasetOut:
        return cls(
            table=None if table is None else table.to_dict(),
            name=info.name,
            accounting=info.accounting.name,
            alphas=list(info.accounting.alphas),
            epsilon=info.epsilon,
            delta=info.delta,
            conversion=info.conversion,
            capacity=info.capacity.tolist(),
            created_at=info.created_at,
            teams=teams,
            unit=info.unit,
            user_column=info.user_column,
            max_rows_per_user=info.max_rows_per_user,
        )

    def info(self) -> DatasetInfo:
        accounting = Accounting.from_dict({"accounting": self.accounting, "alphas": self.alphas})
        return DatasetInfo(
            name=self.name,
            accounting=accounting,
            epsilon=self.epsilon,
            delta=self.delta,
            conversion=self.conversion,
            capacity=_vector(self.capacity),
            created_at=self.created_at,
            unit=self.unit,
            user_column=self.user_column,
            max_rows_per_user=self.max_rows_per_user,
        )


class BlockIn(Model):
    key: str
    location: str | None = None


class BlocksIn(Model):
    blocks: list[BlockIn]
    unlocked: float = Field(0.0, description="Fraction of each block's capacity unlocked at once.")


class BlockOut(Model):
    id: int
    dataset: str
    key: str
    location: str | None
    state: str
    created_at: float
    capacity: list[float]
    locked: list[float]
    unlocked: list[float]
    allocated: list[float]
    consumed: list[float]
    sha256: str | None = None  # its data's fingerprint (administrators only)
    rows: int | None = None  # its record count (administrators only: not released to submitters)

    @classmethod
    def of(cls, info: BlockInfo, admin: bool = False) -> BlockOut:
        return cls(
            sha256=info.sha256 if admin else None,
            rows=info.rows if admin else None,
            id=info.id,
            dataset=info.dataset,
            key=info.key,
            location=info.location,
            state=info.state,
            created_at=info.created_at,
            capacity=info.capacity.tolist(),
            **{b: getattr(info, b).tolist() for b in BUCKETS},
        )

    def info(self) -> BlockInfo:
        return BlockInfo(
            id=self.id,
            dataset=self.dataset,
            key=self.key,
            location=self.location,
            state=self.state,
            created_at=self.created_at,
            capacity=_vector(self.capacity),
            locked=_vector(self.locked),
            unlocked=_vector(self.unlocked),
            allocated=_vector(self.allocated),
            consumed=_vector(self.consumed),
            sha256=self.sha256,
            rows=self.rows,
        )


class SharesOut(Model):
    """A block's budget as fractions of its capacity (:class:`privsched.readouts.Shares`):
    consumed + allocated + left = 1."""

    at: str = Field(description="The dimension read: the RDP order with the most left, or the tighter of ε and δ.")
    consumed: float
    allocated: float
    left: float = Field(description="Not yet given out: capacity − allocated − consumed.")
    unlocked: float = Field(description="The part of left grantable now.")


class BlockBudgetOut(Model):
    """One block's budget in people's terms: shares of its capacity, and ε at the dataset's δ_G."""

    key: str
    state: str
    shares: SharesOut
    epsilon_left: float = Field(description="The ε the budget left guarantees at delta.")
    epsilon_consumed: float = Field(description="The ε consumed so far, read at delta.")
    delta: float = Field(description="The dataset's δ_G under RDP; the budget's own δ left under basic accounting.")
    detail: BlockOut | None = Field(None, description="Its budget vectors (per RDP order, or ε and δ), when asked for.")


class BudgetOut(Model):
    """A dataset's budget, block by block (``GET /v1/budget``, ``privsched budget show -o json``)."""

    dataset: DatasetOut
    blocks: list[BlockBudgetOut]

    @classmethod
    def of(cls, balances: DatasetBalances, *, detail: bool = False, teams: list[str] | None = None) -> BudgetOut:
        from privsched.readouts import block_shares

        info = balances.dataset
        blocks = [
            BlockBudgetOut(
                key=row.block.key,
                state=row.block.state,
                shares=SharesOut(**vars(block_shares(row.block, info))),
                epsilon_left=row.remaining.epsilon,
                epsilon_consumed=row.consumed.epsilon,
                delta=row.remaining.delta,
                detail=BlockOut.of(row.block) if detail else None,
            )
            for row in balances.blocks
        ]
        return cls(dataset=DatasetOut.of(info, teams or []), blocks=blocks)


class ImportOut(Model):
    """What an import did (``POST /v1/datasets/{name}/import``, administrators only)."""

    dataset: str
    added: list[BlockOut]  # the blocks it created, in key order
    kept: list[str]  # keys already imported with exactly these rows
    rows: int  # rows read
    grown: list[str] = Field(default_factory=list)  # user blocks that gained a segment

    @classmethod
    def of(cls, report: ImportReport) -> ImportOut:
        added = [BlockOut.of(b, admin=True) for b in report.added]
        return cls(dataset=report.dataset, added=added, kept=report.kept, rows=report.rows, grown=report.grown)

    def report(self) -> ImportReport:
        from privsched.data.importer import ImportReport

        return ImportReport(dataset=self.dataset, added=[b.info() for b in self.added], kept=self.kept, grown=self.grown, rows=self.rows)


class SubmitIn(Model):
    spec: dict[str, Any] = Field(description="A pipeline specification, as in a pipeline YAML file.")
    id: str | None = Field(None, description="Client-chosen submission id: resubmitting it returns the same pipeline.")


class BlockDemandOut(Model):
    """A pipeline's demand on one block in people's terms (``privsched status``)."""

    key: str
    epsilon: float = Field(description="The ε its demand guarantees at delta.")
    delta: float = Field(description="The dataset's δ_G under RDP; the demand's own δ under basic accounting.")
    share: float = Field(description="The fraction of the block's capacity the demand takes (at its cheapest live order).")
    consumed_epsilon: float | None = Field(None, description="What it consumed there, as ε at delta, once it ended.")

    @classmethod
    def of_pipeline(cls, info: PipelineInfo, dataset: DatasetInfo) -> list[BlockDemandOut]:
        from privsched.readouts import demand_share, pipeline_grants

        return [
            cls(
                key=grant.key,
                epsilon=grant.demand.epsilon,
                delta=grant.demand.delta,
                share=demand_share(info.demands[grant.key], dataset),
                consumed_epsilon=None if grant.consumed is None else grant.consumed.epsilon,
            )
            for grant in pipeline_grants(info, dataset)
        ]


class PipelineOut(Model):
    id: int
    name: str
    dataset: str
    state: str
    owner: str
    team: str | None = None
    weight: float
    timeout: float | None
    submitted_at: float
    granted_at: float | None
    started_at: float | None
    finished_at: float | None
    block_keys: list[str]
    demands: dict[str, list[float]]
    mechanism: str | None
    job: dict[str, Any]
    resources: dict[str, Any]
    placement: dict[str, Any] | None
    consumed: dict[str, list[float]] | None
    message: str | None
    #: The least fraction of its demand an elastic pipeline accepts (None: a fixed demand).
    elastic_min: float | None = None
    #: The fraction of its demand it was granted (None: all of it, or not granted).
    fraction: float | None = None
    #: Its demand per block in people's terms, in answers about one pipeline (not in lists).
    budget: list[BlockDemandOut] | None = None

    @classmethod
    def of(cls, info: PipelineInfo, team: str | None = None, message: str | None = None) -> PipelineOut:
        fields = {name: getattr(info, name) for name in PipelineInfo.__dataclass_fields__}
        fields["demands"] = {k: v.tolist() for k, v in info.demands.items()}
        fields["consumed"] = None if info.consumed is None else {k: v.tolist() for k, v in info.consumed.items()}
        fields["message"] = message
        return cls(team=team, **fields)

    def info(self) -> PipelineInfo:
        fields = self.model_dump(exclude={"team", "budget"})
        fields["demands"] = {k: _vector(v) for k, v in self.demands.items()}
        fields["consumed"] = None if self.consumed is None else {k: _vector(v) for k, v in self.consumed.items()}
        fields["state"] = PipelineState(self.state)
        return PipelineInfo(**fields)


class ArtifactOut(Model):
    name: str  # its path in the job's work folder
    size: int  # bytes


class ResultOut(Model):
    """What a pipeline released (:class:`privsched.results.PipelineResult`)."""

    id: int
    name: str
    dataset: str
    state: str
    reason: str | None
    job: str  # a built-in job's kind, or "function"
    delta: float  # the dataset's δ_G, at which each ε is read
    epsilon: float | None  # the largest ε charged on a block (None until it ended)
    charged: dict[str, float] | None  # ε charged per block
    metrics: dict[str, Any]
    releases: list[dict[str, Any]]  # each privacy primitive's query, ε, δ and value
    first_access: float | None  # when its job first reached its data
    artifacts: list[ArtifactOut]
    reused_from: int | None = None  # the pipeline whose release it returned, at no charge
    answered_from_cache: list[int] | None = None  # the pipelines whose releases answered it, at no charge


class EventOut(Model):
    """One event of the ledger's log (docs/ledger.md): a budget movement or a state change,
    and who caused it."""

    id: int
    at: float
    kind: str
    dataset_id: int | None
    block_id: int | None
    pipeline_id: int | None
    source: str | None
    target: str | None
    amount: list[float] | None
    reason: str | None = Field(
        description="Why (a release's reason; a failure's message, withheld where the job wrote it and the caller may not read its text)."
    )
    actor: str | None = Field(description="Who caused it: a user, operator or scheduler (null: recorded before actors were).")

    @classmethod
    def of(cls, event: Event, show_reason: bool) -> EventOut:
        return cls(
            id=event.id,
            at=event.at,
            kind=event.kind,
            dataset_id=event.dataset_id,
            block_id=event.block_id,
            pipeline_id=event.pipeline_id,
            source=event.source,
            target=event.target,
            amount=None if event.amount is None else event.amount.tolist(),
            reason=event.reason if show_reason else None,
            actor=event.actor,
        )

    def event(self) -> Event:
        fields = self.model_dump()
        fields["amount"] = None if self.amount is None else _vector(self.amount)
        return Event(**fields)


class CancelOut(Model):
    id: int
    outcome: Literal["cancelled", "cancelling"]


class LogsOut(Model):
    text: str
    offset: int = Field(description="Byte offset to ask for next.")
    ended: bool = Field(description="Whether the pipeline has ended (no more output will come).")


class AuditOut(Model):
    ok: bool
    violations: list[str]
    blocks: int
    events: int
    head: str = Field(description="The event log's chain head, <event id>:<hex SHA-256> (docs/ledger.md).")


class SchedulerOut(Model):
    holder: str | None = Field(description="The scheduler serving the ledger, if one holds its lease.")
    condition: str | None = Field(
        None, description="What keeps the scheduler from making progress (e.g. 'storage full since …'; it retries every tick), or null."
    )
    job_starts: str | None = Field(
        None,
        description="How the scheduler starts the next job: 'warm' (forked from its fork server), 'cold: ' and why, "
        "or null (no scheduler serving, or an executor with one way only).",
    )


class UnlockIn(Model):
    fraction: float = Field(description="Fraction of each block's capacity to unlock (capped at what is locked).")
    keys: list[str] | None = Field(None, description="Only these blocks (default: every active block).")


class QuotaIn(Model):
    share: float | None = Field(description="Share of each block's capacity in [0, 1]; null lifts the quota.")


class QuotaOut(Model):
    dataset: str
    quotas: dict[str, float] = Field(description="Team → share of each block's capacity it may hold.")


class QuotaUsageOut(Model):
    """A team's quota on a dataset and how much of it the team has taken
    (:class:`privsched.readouts.QuotaUsage`)."""

    dataset: str
    team: str
    share: float = Field(description="The share of each block's capacity the team may hold.")
    held: float = Field(description="The largest share of a block's capacity the team holds (granted, running, consumed).")
    consumed: float = Field(description="The largest share of a block's capacity the team consumed for good.")


class UserIn(Model):
    name: str
    role: Literal["admin", "submitter", "viewer"]
    team: str | None = None
    code: bool = Field(False, description="A submitter that may submit code jobs (function:); admins always may.")


class CodeIn(Model):
    allowed: bool = Field(description="Whether the submitter may submit code jobs (function:) from now on.")


class UserOut(Model):
    name: str
    role: str
    team: str | None
    created_at: float
    revoked_at: float | None
    code: bool = Field(False, description="Whether the user may submit code jobs (function:); admins always may.")


class TokenOut(Model):
    name: str
    token: str = Field(description="The bearer token; shown once, only its hash is stored.")


class WaitingOut(Model):
    """Why a pending or granted pipeline waits (:class:`privsched.service.waiting.WaitingReason`)."""

    pipeline_id: int
    code: Literal["budget", "quota", "turn", "compute"]
    rank: int
    pending: int
    order: str
    block: str | None = None
    dimension: str | None = None
    demand: float | None = None
    unlocked: float | None = None
    shortfall: float | None = None
    team: str | None = None
    shares: int | None = Field(
        None, description="Round robin: other pipelines waiting on the block, whose water-filled shares the demand includes."
    )
    unlock: Literal["time", "arrivals"] | None = Field(None, description="What releases more budget under the serving unlock rule.")
    fits_at: float | None = Field(
        None, description="Per-time rule: the earliest time (s since the epoch) the demand fits if nothing else is granted."
    )
    arrivals: int | None = Field(None, description="Per-arrival rule: further arrivals on unlock_block it needs.")
    unlock_block: str | None = Field(
        None, description="The block that unlocks enough last; None with unlock set: no further unlock is enough."
    )
    no_estimate: str | None = Field(None, description="With unlock set: why no estimate can be given.")
    need: str | None = Field(None, description="compute: what the job asks for.")
    free: str | None = Field(None, description="compute: what running jobs leave free (None: it fits now).")
    never: str | None = Field(None, description="compute: why the pool can never hold the job.")


class BlockFitOut(Model):
    key: str
    fits_now: bool
    fits_ever: bool
    dimension: str | None = None
    shortfall: float | None = None


class DryRunOut(Model):
    """What a submission would claim (:class:`privsched.service.dryrun.DryRun`)."""

    name: str
    dataset: str
    demand: list[float]
    labels: list[str]
    epsilon: float = Field(description="The ε the demand guarantees at delta, as a pipeline's status reads it.")
    delta: float = Field(description="The dataset's δ_G under RDP; the demand's δ under basic accounting.")
    blocks: list[BlockFitOut]
    verdict: Literal["fits now", "waits", "can never fit"]
    reason: str | None = Field(None, description="Why it waits or can never fit.")
    share: float = Field(0.0, description="The fraction of each block's capacity the demand takes.")
    reuses: int | None = Field(None, description="The pipeline whose release it would return, at no charge.")
    answered_from_cache: list[int] | None = Field(None, description="The pipelines whose releases would answer it, at no charge.")
    epsilon_range: tuple[float, float] | None = Field(None, description="An elastic pipeline's [min, max] of ε.")
    elastic_min: float | None = Field(None, description="The least fraction of the demand (planned at max) it accepts.")


class ErrorOut(Model):
    error: str = Field(description="What went wrong, on one line.")
