"""What a submission would claim, and whether it would be granted, without writing anything:
the demand it would be charged (its curve, read as (ε, δ) at the dataset's δ_G as ``status``
reads it, :func:`privsched.readouts.readout`), and a verdict.

- **can never fit**: no future unlock can satisfy it (docs/design.md §3.3, §4.4): on some
  block the demand exceeds what the block has not consumed, or the block is retired
  (:mod:`privsched.service.unsatisfiable`, the same test the scheduler applies, leaning the
  same way); or the demand alone exceeds its team's quota on a block, less what the team has
  consumed there for good; or the compute pool can never hold the job.
- **waits**: it could fit later: a block's unlocked budget falls short now
  (:func:`privsched.service.waiting.shortfalls`: where it falls shortest), or its team's
  quota is held by the team's granted pipelines.
- **fits now**: every block's unlocked budget and the team's quota hold it now; the policy
  then decides its turn among the pipelines already waiting. A statistic that would reuse a
  release already made (:mod:`privsched.service.reuse`) fits now too: it is completed at
  submission, at no charge, and the dry run names the release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from privsched.budgets.exact import quantize
from privsched.ledger import BlockInfo, DatasetInfo, LedgerError, PipelineRequest
from privsched.readouts import demand_share, demand_text, readout
from privsched.service.unsatisfiable import _ROUNDING
from privsched.service.waiting import shortfalls

Verdict = Literal["fits now", "waits", "can never fit"]
#: The exit status of ``privsched submit --dry-run`` for each verdict.
EXIT_CODES: dict[str, int] = {"fits now": 0, "waits": 3, "can never fit": 4}


@dataclass(frozen=True)
class BlockFit:
    key: str
    fits_now: bool  # the demand fits the block's unlocked budget now
    fits_ever: bool  # the block is active and the demand fits what it has not consumed
    dimension: str | None = None  # where it falls shortest of the unlocked budget (if it does not fit now)
    shortfall: float | None = None


@dataclass(frozen=True)
class Quota:
    """A team's quota on the dataset, as the dry run weighs it (:mod:`privsched.ledger.quotas`)."""

    team: str
    share: float  # of each block's capacity
    held: dict[str, np.ndarray]  # block key → what the team holds (granted, running, consumed)
    consumed: dict[str, np.ndarray]  # block key → what the team's ended pipelines consumed for good


@dataclass(frozen=True)
class DryRun:
    name: str
    dataset: str
    demand: list[float]  # the charged curve (RDP, one ε(α) per order) or (ε, δ)
    labels: list[str]  # the dimension of each value: "α=2" ... or "ε", "δ"
    epsilon: float  # the ε the demand guarantees at ``delta`` (as ``status`` reads it)
    delta: float  # the dataset's δ_G under RDP; the demand's δ under basic accounting
    blocks: list[BlockFit]
    verdict: Verdict = "fits now"
    reason: str | None = None  # why it waits or can never fit
    share: float = 0.0  # the fraction of each block's capacity the demand takes (readouts.demand_share)
    reuses: int | None = None  # the pipeline whose release it would return at no charge (privsched.ledger.reuse)
    answered_from_cache: list[int] | None = None  # the pipelines whose releases would answer it at no charge
    epsilon_range: tuple[float, float] | None = None  # an elastic pipeline's [min, max] of ε (docs/design.md §10)
    elastic_min: float | None = None  # the least fraction of the demand (planned at max) it accepts

    @property
    def exit_code(self) -> int:
        """0 when it fits now, 3 when it waits, 4 when it can never fit."""
        return EXIT_CODES[self.verdict]

    def lines(self) -> list[str]:
        """The dry run as text: the demand, one line per block, the verdict."""
        head = [f"pipeline {self.name} on {self.dataset}: demand ε={self.epsilon:.4g} at δ={self.delta:g}"]
        if self.epsilon_range is not None:
            low, high = self.epsilon_range
            least = self.elastic_min or 1.0
            head.append(f"elastic: epsilon in [{low:g}, {high:g}]; the demand is at {high:g}, any {least:.4g} of it or more")
        for fit in self.blocks:
            if fit.fits_now:
                state = "fits now"
            elif not fit.fits_ever:
                state = "can never fit"
            else:
                state = f"does not fit now: {fit.dimension} short {fit.shortfall:.4g}"
            head.append(f"{demand_text(self.epsilon, self.share, fit.key)}: {state}")
        if self.reuses is not None:
            head.append(f"reuses the release of pipeline {self.reuses}: charged 0")
        if self.answered_from_cache is not None:
            head.append(f"answered from the cached releases of pipelines {', '.join(map(str, self.answered_from_cache))}: charged 0")
        head.append(self.verdict if self.reason is None else f"{self.verdict}: {self.reason}")
        return head


def dry_run(
    request: PipelineRequest, dataset: DatasetInfo, blocks: list[BlockInfo], *, quota: Quota | None = None, compute: str | None = None
) -> DryRun:
    """The dry run of a built request (``build_request``) on the dataset's ``blocks``;
    ``quota``: the submitter's team's quota on the dataset, if it has one; ``compute``: why
    the pool can never hold the job, if it cannot."""
    by_key = {b.key: b for b in blocks}
    missing = [k for k in request.block_keys if k not in by_key]
    if missing:
        raise LedgerError(f"unknown block {missing[0]!r} in dataset {dataset.name!r}")
    accounting = dataset.accounting
    chosen = [by_key[k] for k in request.block_keys]
    demand = quantize(np.asarray(request.demand, dtype=float), up=True)  # as the ledger records it (docs/design.md §3.3)
    demands = np.tile(demand, (len(chosen), 1))
    capacity = np.stack([b.capacity for b in chosen])
    live = accounting.live(capacity)
    fits, dim, gap = shortfalls(accounting, demands, np.stack([b.unlocked for b in chosen]), capacity)
    left = capacity - np.stack([b.consumed for b in chosen]) + _ROUNDING * np.abs(capacity)
    ever = accounting.fits(demands, left, live) & np.array([b.state == "active" for b in chosen])
    labels = accounting.dimension_labels()
    fits_of = [
        BlockFit(b.key, bool(f), bool(e), None if f else labels[int(d)], None if f else float(g))
        for b, f, e, d, g in zip(chosen, fits, ever, dim, gap)
    ]
    verdict, reason = _verdict(fits_of, chosen, demands, capacity, live, dataset, quota, compute)
    shown = readout(demand, dataset)
    share = demand_share(demand, dataset)
    least = request.job.get("epsilon_min")
    elastic = None if least is None else (float(least), float(request.job["epsilon"]))
    return DryRun(
        request.name,
        dataset.name,
        demand.tolist(),
        labels,
        shown.epsilon,
        shown.delta,
        fits_of,
        verdict,
        reason,
        share,
        epsilon_range=elastic,
        elastic_min=request.elastic_min,
    )


def _verdict(
    fits: list[BlockFit],
    blocks: list[BlockInfo],
    demands: np.ndarray,
    capacity: np.ndarray,
    live: np.ndarray,
    dataset: DatasetInfo,
    quota: Quota | None,
    compute: str | None,
) -> tuple[Verdict, str | None]:
    """The verdict and its reason (module docstring), the first that applies."""
    accounting = dataset.accounting
    where = "at every live order" if accounting.is_rdp else "in ε or δ"
    if compute is not None:
        return "can never fit", compute
    for fit, block in zip(fits, blocks):
        if not fit.fits_ever:
            if block.state != "active":
                return "can never fit", f"block {block.key!r} is {block.state}"
            return "can never fit", f"its demand exceeds what block {block.key!r} has not consumed {where}"
    if quota is not None:
        limit = quota.share * capacity
        zero = np.zeros(demands.shape[1])
        spent = np.stack([quota.consumed.get(b.key, zero) for b in blocks])
        over = ~accounting.fits(demands + spent, limit, live)
        if over.any():
            key = blocks[int(np.argmax(over))].key
            return "can never fit", f"its demand exceeds what team {quota.team}'s quota ({quota.share:g}) leaves on block {key!r} {where}"
        held = np.stack([quota.held.get(b.key, zero) for b in blocks])
        over = ~accounting.fits(demands + held, limit, live)
        if over.any():
            key = blocks[int(np.argmax(over))].key
            return "waits", f"quota: team {quota.team} holds too much of its quota ({quota.share:g}) on block {key!r}"
    for fit in fits:
        if not fit.fits_now:
            return "waits", f"budget: block {fit.key} {fit.dimension} short {fit.shortfall:.4g} of the unlocked budget"
    return "fits now", None
