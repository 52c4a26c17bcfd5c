"""Turning a pipeline specification into a ledger claim (a :class:`PipelineRequest`).

The privacy demand comes from, in this order: an explicit ``mechanism`` description; a
built-in job's own plan (:func:`privsched.trainers.builtin.plan_mechanism` for the target
(ε, δ)), which is what the job then runs with; or the plain (ε, δ) (under RDP: a pure ε-DP declaration is charged min(ε, αε²/2);
δ > 0 without a named mechanism is refused, docs/design.md §3.4). A job that asks for more compute than the pool has is refused here, before
anything is written (docs/design.md §4.4).
"""

from __future__ import annotations

import getpass

from privsched.budgets.mechanisms import EpsilonDelta, Mechanism, demand_vector, mechanism_json, parse_mechanism
from privsched.ledger import LedgerError
from privsched.ledger.models import BlockInfo, DatasetInfo, PipelineRequest
from privsched.service.resources import Pool
from privsched.spec import PipelineSpec, SpecError, select_blocks


def builtin_job(spec: PipelineSpec) -> dict:
    """A built-in job's dict as :mod:`privsched.trainers.builtin` reads it: its kind and parameters."""
    return {"kind": spec.job.kind, **spec.job.params}


def demand_mechanism(spec: PipelineSpec, dataset: DatasetInfo) -> Mechanism:
    """The mechanism a pipeline is charged for (see the module docstring)."""
    if spec.mechanism is not None and spec.job.kind is not None:
        raise SpecError(f"a {spec.job.kind} job plans the mechanism it is charged: give 'epsilon' (and 'delta'), not a 'mechanism'")
    if spec.mechanism is not None:
        return parse_mechanism(spec.mechanism)
    epsilon, delta = float(spec.epsilon), float(spec.delta or 0.0)  # type: ignore[arg-type]
    if spec.job.kind is not None:
        from privsched.trainers.builtin import plan_mechanism

        return plan_mechanism(builtin_job(spec), epsilon, delta, dataset.accounting)
    return EpsilonDelta(epsilon=epsilon, delta=delta)


def build_request(
    spec: PipelineSpec, dataset: DatasetInfo, blocks: list[BlockInfo], pool: Pool | None, owner: str | None = None
) -> PipelineRequest:
    """The ledger claim for ``spec`` on ``dataset``, whose blocks in order of addition are
    ``blocks`` (needed only by ``Last`` and ``Range`` selectors: the ledger checks explicit
    keys). Any problem raises :class:`LedgerError` with one line; nothing is written."""
    try:
        keys = select_blocks(spec.blocks, [b.key for b in blocks], [b.key for b in blocks if b.state == "active"])
        if pool is not None and (refusal := pool.refusal(spec.resources)) is not None:
            raise SpecError(refusal)
        mechanism = demand_mechanism(spec, dataset)
        demand = demand_vector(mechanism, dataset.accounting)
    except ValueError as exc:  # SpecError, pydantic and budget errors are all ValueErrors
        raise LedgerError(f"pipeline {spec.name!r}: {exc}") from None
    job = spec.job.model_dump()
    job.update(max_runtime=spec.max_runtime, epsilon=spec.epsilon, delta=spec.delta)
    return PipelineRequest(
        name=spec.name,
        dataset=spec.dataset,
        block_keys=keys,
        demand=demand,
        mechanism=mechanism_json(mechanism),
        weight=spec.weight,
        timeout=spec.timeout,
        owner=spec.owner or owner or getpass.getuser(),
        job=job,
        resources=spec.resources.model_dump(),
    )
