"""Turning a pipeline specification into a ledger claim (a :class:`PipelineRequest`).

The privacy demand comes from, in this order: an explicit ``mechanism`` description; a
built-in job's own plan (:func:`privsched.trainers.builtin.plan_mechanism` for the target
(ε, δ), a statistic's ε derived from its ``accuracy``:
:func:`privsched.service.cache.accuracy_epsilon`), which is what the job then runs with; or
the plain (ε, δ) (under RDP: a pure ε-DP declaration is charged min(ε, αε²/2); δ > 0
without a named mechanism is refused, docs/design.md §3.4). An elastic range
``epsilon: [min, max]`` is charged the demand planned at its max and accepts any fraction of
it down to :func:`~privsched.budgets.elastic.minimum_fraction` of the curves planned at its
min and max (docs/design.md §10). A job that asks for more compute than the pool has is
refused here, before anything is written (docs/design.md §4.4). A code job is checked first, at no charge
(:func:`checked_code`, :mod:`privsched.service.preflight`).
"""

from __future__ import annotations

import getpass
import json
from typing import TYPE_CHECKING

from privsched.budgets.mechanisms import EpsilonDelta, Mechanism, demand_vector, mechanism_json, parse_mechanism
from privsched.ledger import LedgerError
from privsched.ledger.models import BlockInfo, DatasetInfo, PipelineRequest
from privsched.service.resources import Pool
from privsched.spec import PipelineSpec, SpecError, select_blocks

if TYPE_CHECKING:
    import numpy as np


def checked_code(spec: PipelineSpec, protected: list[str], checked: dict[str, str | None] | None = None) -> PipelineSpec:
    """``spec`` with its code job's paths made absolute, once the job passed its preflight
    (:mod:`privsched.service.preflight`: no overlap with the ``protected`` paths; imports,
    confined and without data, into a function of one argument); a declarative job as it is.
    ``checked``: verdicts of jobs already checked, by job, shared by one batch. A problem
    raises :class:`LedgerError` with one line; nothing is written."""
    if spec.job.function is None:
        return spec
    from privsched.service.preflight import code_problem, resolve_code
    from privsched.spec import JobSpec

    try:
        job = resolve_code(spec.job.model_dump())
    except ValueError as exc:
        raise LedgerError(f"pipeline {spec.name!r}: {exc}") from None
    key = json.dumps([job["function"], job["pythonpath"]])
    if checked is None or key not in checked:
        problem = code_problem(job, protected)
        if checked is not None:
            checked[key] = problem
    else:
        problem = checked[key]
    if problem is not None:
        raise LedgerError(f"pipeline {spec.name!r}: {problem}")
    return spec.model_copy(update={"job": JobSpec.model_validate(job)})


def builtin_job(spec: PipelineSpec) -> dict:
    """A built-in job's dict as :mod:`privsched.trainers.builtin` reads it: its kind and parameters."""
    return {"kind": spec.job.kind, **spec.job.params}


def demand_mechanism(spec: PipelineSpec, dataset: DatasetInfo, epsilon: float | None = None) -> Mechanism:
    """The mechanism a pipeline is charged for (see the module docstring), planned at
    ``epsilon`` (default: the most it asks for)."""
    if spec.mechanism is not None and spec.job.kind is not None:
        raise SpecError(f"a {spec.job.kind} job plans the mechanism it is charged: give 'epsilon' (and 'delta'), not a 'mechanism'")
    if spec.mechanism is not None:
        return parse_mechanism(spec.mechanism)
    if spec.accuracy is not None:
        from privsched.service.cache import accuracy_epsilon

        epsilon, delta = accuracy_epsilon(spec, dataset), float(spec.delta or 0.0)
    else:
        epsilon, delta = float(epsilon or spec.epsilon_max), float(spec.delta or 0.0)  # type: ignore[arg-type]
    if spec.job.kind is not None:
        from privsched.trainers.builtin import plan_mechanism

        if spec.job.kind == "dpsgd" and dataset.unit != "record" and dataset.max_rows_per_user > 1:
            from privsched.trainers.plans import DPSGDJob, check_person_level, parse_job

            job = parse_job(builtin_job(spec))
            if isinstance(job, DPSGDJob):
                check_person_level(job)  # it samples and clips per person: q is over people
            if spec.resources.workers > 1:
                raise SpecError("person-level DP-SGD trains in one process: ask for one worker")
        return plan_mechanism(builtin_job(spec), epsilon, delta, dataset.accounting, dataset.max_rows_per_user)
    return EpsilonDelta(epsilon=epsilon, delta=delta)


def memory_problem(spec: PipelineSpec, selected: list[BlockInfo]) -> str | None:
    """Why a DP-SGD job's declared ``resources.memory`` cannot hold its model's training
    (:mod:`privsched.trainers.memory`), or None; nothing to check without a declared memory."""
    if spec.job.kind != "dpsgd" or not spec.resources.memory:
        return None
    from privsched.trainers.memory import memory_problem as training_memory_problem
    from privsched.trainers.plans import DPSGDJob, parse_job

    job = parse_job(builtin_job(spec))
    assert isinstance(job, DPSGDJob)
    rows = [b.rows for b in selected]
    known = sum(r for r in rows if r is not None) if rows and None not in rows else None
    return training_memory_problem(job, spec.resources.memory, spec.resources.processes, known)


def ranks(spec: PipelineSpec) -> int:
    """The data-parallel processes the pipeline's job trains on (one for any job but DP-SGD)."""
    return spec.resources.processes if spec.job.kind == "dpsgd" else 1


def build_request(
    spec: PipelineSpec, dataset: DatasetInfo, blocks: list[BlockInfo], pool: Pool | None, owner: str | None = None
) -> PipelineRequest:
    """The ledger claim for ``spec`` on ``dataset``, whose blocks in order of addition are
    ``blocks`` (needed only by ``Last`` and ``Range`` selectors: the ledger checks explicit
    keys). Any problem raises :class:`LedgerError` with one line; nothing is written."""
    try:
        keys = select_blocks(spec.blocks, [b.key for b in blocks], [b.key for b in blocks if b.state == "active"])
        if pool is not None and (refusal := pool.refusal(spec.resources, ranks(spec))) is not None:
            raise SpecError(refusal)
        mechanism = demand_mechanism(spec, dataset)
        demand = demand_vector(mechanism, dataset.accounting)
        elastic_min = elastic_fraction(spec, dataset, demand)
        if (problem := memory_problem(spec, [b for b in blocks if b.key in keys])) is not None:
            raise SpecError(problem)
    except ValueError as exc:  # SpecError, pydantic and budget errors are all ValueErrors
        raise LedgerError(f"pipeline {spec.name!r}: {exc}") from None
    job = spec.job.model_dump()
    job.update(max_runtime=spec.max_runtime, epsilon=spec.epsilon_max, delta=spec.delta)
    if spec.accuracy is not None:
        job.update(accuracy=spec.accuracy.model_dump())
    if spec.elastic:
        job.update(epsilon_min=spec.epsilon_min)
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
        elastic_min=elastic_min,
    )


def elastic_fraction(spec: PipelineSpec, dataset: DatasetInfo, demand: np.ndarray) -> float | None:
    """The least fraction of ``demand`` (planned at the range's max) an elastic pipeline
    accepts: the smallest f with f · demand ≥ the curve planned at its min at every live
    order (:func:`~privsched.budgets.elastic.minimum_fraction`); None for a fixed ε."""
    if not spec.elastic:
        return None
    from privsched.budgets.elastic import minimum_fraction

    least = demand_vector(demand_mechanism(spec, dataset, spec.epsilon_min), dataset.accounting)
    return minimum_fraction(least, demand, dataset.accounting.live(dataset.capacity))
