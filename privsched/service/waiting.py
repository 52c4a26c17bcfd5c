"""Why a pipeline waits: a pending one, the block and order where its demand falls shortest
of the unlocked budget, by how much, when the unlock rule will have released enough, and its
rank in the policy's order, or its team's quota; a granted one, the compute it waits for
(after Slurm's reason codes and ``condor_q -better-analyze``).

A demand d fits a block's unlocked budget u when ``Accounting.fits`` says so (docs/design.md §3.3):
under basic composition d ≤ u in ε and in δ; under RDP d(α) ≤ u(α) at some live order α
(Luo et al., OSDI'21 §4.2). So a pipeline that does not fit is reported at the block where
it is furthest from fitting, with the dimension that decides it: under basic accounting
the one with the largest shortfall d − u (both must fit), under RDP the live order with
the smallest shortfall (one order is enough). A pipeline that fits every block waits
only for its turn: the scheduler's next pass, behind those ranked before it.

When more budget will unlock (docs/design.md §4.1): under a per-time rule (DPF-T) the
earliest time at which the demand fits every block if nothing else is granted meanwhile,
under a per-arrival rule (DPF-N) the fewest further pipeline arrivals on a block after which
it fits, both solved on the scheduler's own unlock computation
(:func:`~privsched.policies.unlock.earliest_fit_time`, :func:`~privsched.policies.unlock.arrivals_to_fit`).
Neither may exist: the rule may have too little left locked, and the pipeline then waits for
budget that ends up released (a job that spends less than its grant).

What else holds a pipeline back is counted, so that no estimate is one it cannot meet:

- a team quota (:mod:`privsched.ledger.quotas`): a pipeline whose grant would take its team
  past its share of a block waits with the quota as its reason, whatever budget it also
  lacks, and with no unlock estimate: a team holds what its pipelines were granted and
  consumed, which no unlock lowers (only its jobs ending under their grants, a release, or
  a larger quota lift it);
- round robin's reservations (docs/design.md §4.2): budget the scheduler has set aside for
  other pipelines is not available, and a pipeline is granted only once the water-filling
  fills it on every block: with r_e what edge e still needs beyond its reservation, it is
  filled once its block's unreserved budget holds ``Σ_k min(r_k, r_e)`` over the pipelines
  k waiting there (:func:`~privsched.policies.round_robin.fill_requirement`). That sum is
  the demand the reason reports, and the estimates solve for; the scheduler records its
  reservations in the runs folder for every client to read. Under a per-arrival rule no
  estimate is given: each arrival that unlocks budget on a block also takes a share of it.

A granted pipeline waits for compute: the scheduler places granted jobs in grant order on
what running jobs leave free, letting smaller jobs behind one that does not fit go first
(:meth:`privsched.service.scheduler.Scheduler.place`); the same walk over the recorded pool
says what each waiting job lacks. One that the whole pool can never hold is failed by the
scheduler's next pass (and refused at submission).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from privsched.ledger.models import PendingView, PipelineInfo

if TYPE_CHECKING:  # the remote client reads reasons without loading the policies
    from privsched.budgets.accounting import Accounting
    from privsched.policies.base import Policy, Snapshot, UnlockRule
    from privsched.service.resources import Pool


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


@dataclass(frozen=True)
class WaitingReason:
    pipeline_id: int
    code: str  # "budget": does not fit the unlocked budget; "quota": its team's quota (whatever budget it also
    #            lacks); "turn": waits its turn; "compute" (granted): waits for free compute
    rank: int  # 1-based position among the dataset's pending pipelines in the policy's order ("compute":
    #            among the granted jobs waiting for compute, in grant order)
    pending: int  # how many pipelines are pending on the dataset ("compute": granted jobs waiting)
    order: str  # the order ranked in: the serving policy's name, "arrival", or "grant"
    block: str | None = None  # the block where the demand falls shortest ("budget" only)
    dimension: str | None = None  # "ε", "δ" or "α=4" where it is decided
    demand: float | None = None  # the demand in that block and dimension
    unlocked: float | None = None  # the unlocked budget there
    shortfall: float | None = None  # demand − unlocked (> 0)
    team: str | None = None  # the team at its quota ("quota" only)
    shares: int | None = None  # round robin ("budget"): other pipelines waiting on ``block``, whose water-filled
    #                            shares (each up to its own need) ``demand`` includes
    unlock: str | None = None  # "time" or "arrivals": what releases more budget under the serving rule
    fits_at: float | None = None  # "time": the earliest time it fits if nothing else is granted
    arrivals: int | None = None  # "arrivals": further pipeline arrivals on ``unlock_block`` it needs
    unlock_block: str | None = None  # the block that unlocks last; None with ``unlock`` set: never enough
    no_estimate: str | None = None  # with ``unlock`` set: why no estimate can be given
    need: str | None = None  # "compute": the compute the job asks for
    free: str | None = None  # "compute": what running jobs leave free of the pool
    never: str | None = None  # "compute": why the pool can never hold the job (the scheduler fails it)

    def text(self) -> str:
        """One short line, for the REASON column and ``status``."""
        rank = f"rank {self.rank}/{self.pending} ({self.order})"
        if self.code == "turn":
            return f"fits now; waits for its turn, {rank}"
        if self.code == "quota":
            return (
                f"quota: team {self.team} would exceed its quota on block {self.block}; no unlock lifts it, "
                f"it waits for the team to hold less or for a larger quota; {rank}"
            )
        if self.code == "compute":
            if self.never is not None:
                return f"compute: never: {self.never}"
            if self.free is None:
                return f"compute: fits the free compute, starts at the scheduler's next pass; {rank}"
            return f"compute: needs {self.need}, free {self.free}; {rank}"
        needs, free = f"needs {self.demand:.4g}", "unlocked" if self.shares is None else "unreserved"  # round robin: unreserved
        if self.shares:
            needs += f" with the round-robin shares of {self.shares} other pipeline(s)"
        return (
            f"budget: block {self.block} {self.dimension} {needs}, "
            f"{free} {self.unlocked:.4g} (short {self.shortfall:.4g}){self._outlook()}; {rank}"
        )

    def _outlook(self) -> str:
        if self.unlock is None:
            return ""
        if self.no_estimate is not None:
            return f"; no unlock estimate: {self.no_estimate}"
        if self.unlock_block is None:
            return "; no further unlock is enough, waits for budget to be released"
        if self.unlock == "time":
            return f"; fits by {_clock(self.fits_at or 0.0)} (block {self.unlock_block}) if nothing else is granted"
        if not self.arrivals:
            return "; the arrivals so far release enough at the scheduler's next unlock"
        return f"; fits after {self.arrivals} more arrival(s) on block {self.unlock_block} if nothing else is granted"

    def short(self) -> str:
        """A few words, for the REASON column of ``privsched list``."""
        if self.code == "turn":
            return f"turn {self.rank}/{self.pending}"
        if self.code == "quota":
            return f"quota {self.team} {self.block}"
        if self.code == "compute":
            return "compute never" if self.never is not None else f"compute {self.rank}/{self.pending}"
        outlook = ""
        if self.unlock is not None:
            outlook = (
                " ?"
                if self.no_estimate is not None
                else " never"
                if self.unlock_block is None
                else f" by {_clock(self.fits_at or 0.0)[5:16]}"
                if self.unlock == "time"
                else f" +{self.arrivals}"
            )
        return f"budget {self.block} {self.dimension} short {self.shortfall:.3g}{outlook}"

    def to_dict(self) -> dict:
        return asdict(self)


def shortfalls(
    accounting: Accounting, demand: np.ndarray, available: np.ndarray, capacity: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For (E, K) demands against available budgets: whether each fits, the dimension that
    decides (see the module docstring), and the shortfall d − u there (≤ 0 when it fits)."""
    live = accounting.live(capacity)
    fits = accounting.fits(demand, available, live)
    with np.errstate(invalid="ignore"):
        gap = demand - available
    if accounting.is_rdp:  # the closest live order decides
        dim = np.argmin(np.where(live, gap, np.inf), axis=1)
    else:  # the worst dimension decides
        dim = np.argmax(gap, axis=1)
    return fits, dim, gap[np.arange(len(gap)), dim]


@dataclass(frozen=True)
class UnlockState:
    """What the serving unlock rule will still release on a view's blocks (aligned with
    :attr:`~privsched.ledger.models.PendingView.block_ids`), as the scheduler computes it."""

    rule: UnlockRule
    locked: np.ndarray  # (B, K) budget not yet unlocked
    created: np.ndarray  # (B,) creation times, from which per-time unlocking counts
    arrivals: np.ndarray  # (B,) pipelines that ever asked for each block
    now: float  # the clock


def _outlooks(
    snapshot: Snapshot,
    demand: np.ndarray,
    block_ids: np.ndarray,
    state: UnlockState,
    pipelines: np.ndarray,
    block_keys: dict[int, str],
    water: bool,
) -> dict[int, dict]:
    """For pipeline indices ``pipelines`` of ``snapshot`` (whose blocks are ``block_ids``), with
    ``demand`` (E, K) what each edge needs of its block's available budget: the unlock fields
    of their reasons. Under round robin (``water``) a per-arrival rule gives no estimate: each
    arrival that unlocks budget also takes a share of it."""
    from privsched.policies.unlock import arrivals_to_fit, earliest_fit_time

    rule = state.rule
    by_time, by_arrival = float(rule.on_tick(1.0)) > 0, float(rule.on_pipeline_arrival()) > 0
    if not (by_time or by_arrival) or len(pipelines) == 0:
        return {}
    if water and not by_time:
        return {int(p): {"unlock": "arrivals", "no_estimate": ARRIVALS_SHARE} for p in pipelines.tolist()}
    edges = np.flatnonzero(np.isin(snapshot.edge_pipeline, pipelines))
    rows = snapshot.edge_block[edges]
    balances = (snapshot.accounting, demand[edges], snapshot.unlocked[rows], snapshot.capacity[rows], state.locked[rows])
    if by_time:
        when = earliest_fit_time(rule, *balances, state.arrivals[rows], state.created[rows], state.now)
        never = np.isinf(when)
    else:
        when = arrivals_to_fit(rule, *balances, state.arrivals[rows], state.now - state.created[rows]).astype(float)
        never = when < 0
    owners = snapshot.edge_pipeline[edges]  # edges come grouped by pipeline
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    found = {}
    for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(owners)]):
        p, mine = int(owners[start]), np.arange(start, end)
        fields: dict = {"unlock": "time" if by_time else "arrivals"}
        if not never[mine].any():
            last = mine[np.argmax(when[mine])]
            fields["unlock_block"] = block_keys.get(int(block_ids[rows[last]]))
            fields["fits_at" if by_time else "arrivals"] = float(when[last]) if by_time else int(when[last])
        found[p] = fields
    return found


#: Why round robin under a per-arrival rule gives no unlock estimate.
ARRIVALS_SHARE = "under round robin each arrival that unlocks budget also takes a share of it"


def _fill_requirements(snapshot: Snapshot) -> tuple[np.ndarray, np.ndarray]:
    """Under round robin: what each edge needs of its block's unreserved budget to be filled
    (:func:`~privsched.policies.round_robin.fill_requirement` of what it still needs beyond its
    reservation, per dimension), and how many other edges wait on its block."""
    from privsched.policies.round_robin import fill_requirement, remaining_need

    demand = np.asarray(snapshot.edge_demand, dtype=float)
    reserved = np.zeros_like(demand) if snapshot.reserved is None else snapshot.reserved
    need = remaining_need(demand, reserved)
    required = np.stack([fill_requirement(snapshot.edge_block, need[:, k]) for k in range(demand.shape[1])], axis=1)
    waiting = need.max(axis=1) > 0
    per_block = np.bincount(snapshot.edge_block[waiting], minlength=snapshot.n_blocks)
    return required, per_block[snapshot.edge_block] - waiting


def waiting_reasons(
    view: PendingView,
    block_keys: dict[int, str],
    policy: Policy | None = None,
    now: float = 0.0,
    quota: Callable | None = None,
    unlock: UnlockState | None = None,
    reserved: Mapping[tuple[int, int], np.ndarray] | None = None,
    only: int | None = None,
) -> list[WaitingReason]:
    """The reason of every pending pipeline in ``view``; ``block_keys`` maps block ids to
    keys. Ranks follow ``policy.order`` when the policy orders pipelines one by one
    (``per_pipeline_order``), else arrival order. ``quota(pipeline_id, block_ids, demand,
    capacity)`` gives (team, index of the block) when granting a pipeline would exceed its
    team's quota (:meth:`privsched.ledger.quotas.QuotaCheck.refusal`): that is its reason,
    whatever budget it lacks. With ``unlock`` (the serving rule and the blocks' state), a
    pipeline short of budget also says when the rule will have released enough (module
    docstring). Under round robin, ``reserved`` are the scheduler's reservations (by pipeline
    id and block id), and a pipeline fits once the unreserved budget fills it beside the
    others waiting on its blocks (module docstring). With ``only`` (a pipeline id), the
    reason of that pipeline alone, ranked among all (none if it is not pending)."""
    from privsched.policies.base import orders_per_pipeline
    from privsched.policies.fcfs import FirstComeFirstServed
    from privsched.policies.round_robin import RoundRobin
    from privsched.service.snapshot import edge_reservations, snapshot_of

    water = isinstance(policy, RoundRobin)
    snapshot = snapshot_of(view, now, edge_reservations(view, reserved or {}) if water else None)
    accounting, block_ids = snapshot.accounting, view.block_ids
    count = snapshot.n_pipelines
    if count == 0:
        return []
    if policy is not None and orders_per_pipeline(policy):
        order, order_name = policy.order(snapshot), policy.name
    else:
        order, order_name = FirstComeFirstServed().order(snapshot), "arrival"
    wanted = range(count) if only is None else np.flatnonzero(snapshot.pipeline_ids == only).tolist()
    rank = np.empty(count, dtype=np.intp)
    rank[order] = np.arange(1, count + 1)

    demand = snapshot.edge_demand  # an elastic pipeline waits for the least it accepts
    if snapshot.elastic_min is not None:
        demand = demand * np.asarray(snapshot.elastic_min)[snapshot.edge_pipeline][:, None]
    required, others = _fill_requirements(snapshot) if water else (demand, None)
    unlocked = snapshot.unlocked[snapshot.edge_block]
    fits, dim, edge_gap = shortfalls(accounting, required, unlocked, snapshot.capacity[snapshot.edge_block])
    labels = accounting.dimension_labels()

    by_pipeline = np.argsort(snapshot.edge_pipeline, kind="stable")  # each pipeline's edges in edge order
    starts = np.searchsorted(snapshot.edge_pipeline[by_pipeline], np.arange(count + 1))
    over = {}
    if quota is not None:
        for p in wanted:
            edges = by_pipeline[starts[p] : starts[p + 1]]
            blocks = block_ids[snapshot.edge_block[edges]]
            refused = quota(int(snapshot.pipeline_ids[p]), blocks.tolist(), demand[edges], snapshot.capacity[snapshot.edge_block[edges]])
            if refused is not None:
                over[p] = (refused[0], block_keys.get(int(blocks[refused[1]])))
    short_of_budget = set(snapshot.edge_pipeline[~fits].tolist()).intersection(wanted) - over.keys()
    budget_short = np.array(sorted(short_of_budget), dtype=np.intp)  # not np.setdiff1d: it loads numpy.ma
    outlooks = {} if unlock is None else _outlooks(snapshot, required, block_ids, unlock, budget_short, block_keys, water)
    reasons = []
    for p in wanted:
        edges = by_pipeline[starts[p] : starts[p + 1]]
        turn = WaitingReason(pipeline_id=int(snapshot.pipeline_ids[p]), code="turn", rank=int(rank[p]), pending=count, order=order_name)
        short = edges[~fits[edges]]
        if p in over:
            reasons.append(replace(turn, code="quota", team=over[p][0], block=over[p][1]))
            continue
        if len(short) == 0:
            reasons.append(turn)
            continue
        e = short[np.argmax(edge_gap[short])]
        d = int(dim[e])
        reasons.append(
            replace(
                turn,
                code="budget",
                block=block_keys.get(int(block_ids[snapshot.edge_block[e]])),
                dimension=labels[d],
                demand=float(required[e, d]),
                unlocked=float(unlocked[e, d]),
                shortfall=float(edge_gap[e]),
                shares=None if others is None else int(others[e]),
                **outlooks.get(p, {}),
            )
        )
    return reasons


def compute_reasons(granted: list[PipelineInfo], running: list[PipelineInfo], pool: Pool) -> list[WaitingReason]:
    """Why each granted pipeline's job has not started: the walk of
    :meth:`~privsched.service.scheduler.Scheduler.place` (grant order, backfilling) over what
    the ``running`` jobs leave free of ``pool``. A job that fits what is left starts at the
    scheduler's next pass; one the whole pool can never hold is failed by it."""
    from pydantic import ValidationError

    from privsched.service.resources import FreeCompute, Placement
    from privsched.spec import Resources

    free = FreeCompute(pool)
    for info in running:
        free.hold(info.id, Placement.from_record(info.placement))
    waiting = sorted(granted, key=lambda p: (p.granted_at or 0, p.id))
    reasons = []
    for rank, info in enumerate(waiting, start=1):
        base = WaitingReason(pipeline_id=info.id, code="compute", rank=rank, pending=len(waiting), order="grant")
        try:
            need = Resources.model_validate(info.resources)
        except ValidationError:
            reasons.append(replace(base, never="invalid resources"))
            continue
        refusal = pool.refusal(need)
        if refusal is not None:
            reasons.append(replace(base, need=need.describe(), never=refusal))
        elif free.place(info.id, need) is None:
            left = Resources.model_construct(gpus=len(free.free_gpus), cpus=max(free.free_cpus, 0.0), memory=max(free.free_memory, 0))
            reasons.append(replace(base, need=need.describe(), free=left.describe()))
        else:
            reasons.append(replace(base, need=need.describe()))
    return reasons
