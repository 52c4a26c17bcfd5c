"""Turning database rows into the ledger's data classes. Budget vectors are handed over as
the stored BLOBs, decoded when first read (:mod:`~privsched.ledger.vectors`)."""

from __future__ import annotations

import json
from typing import Any

from privsched.budgets.accounting import Accounting
from privsched.ledger.models import BUCKETS, BlockInfo, DatasetInfo, Event, PipelineInfo
from privsched.ledger.states import PipelineState

DATASET_COLUMNS = "id, name, accounting, alphas, epsilon, delta, conversion, capacity, created_at, unit, user_column, max_rows_per_user"
BLOCK_COLUMNS = (
    "b.id, d.name, b.key, b.location, b.state, b.created_at, bal.capacity, bal.locked, bal.unlocked, bal.allocated, bal.consumed, "
    "b.sha256, b.rows"
)
BLOCK_FROM = "blocks b JOIN datasets d ON d.id = b.dataset_id JOIN balances bal ON bal.block_id = b.id"
PIPELINE_COLUMNS = (
    "p.id, p.name, d.name, p.state, p.owner, p.weight, p.timeout, p.submitted_at, p.granted_at, "
    "p.started_at, p.finished_at, p.mechanism, p.job, p.resources, p.placement, p.message, p.elastic_min, p.fraction"
)
PIPELINE_FROM = "pipelines p JOIN datasets d ON d.id = p.dataset_id"
EVENT_COLUMNS = "id, at, kind, dataset_id, block_id, pipeline_id, source, target, amount, reason, detail, actor"


def dataset(row: tuple) -> DatasetInfo:
    id_, name, accounting, alphas, epsilon, delta, conversion, capacity, created_at, unit, user_column, k = row
    mode = Accounting.from_dict({"accounting": accounting, "alphas": json.loads(alphas)})
    return DatasetInfo(
        name=name,
        accounting=mode,
        epsilon=epsilon,
        delta=delta,
        conversion=conversion,
        capacity=capacity,
        created_at=created_at,
        id=id_,
        unit=unit or "record",
        user_column=user_column,
        max_rows_per_user=k or 1,
    )


def block(row: tuple) -> BlockInfo:
    id_, dataset_name, key, location, state, created_at, capacity, *buckets, sha256, records = row
    return BlockInfo(
        id=id_,
        dataset=dataset_name,
        key=key,
        location=location,
        state=state,
        created_at=created_at,
        capacity=capacity,
        **dict(zip(BUCKETS, buckets)),
        sha256=sha256,
        rows=records,
    )


def pipeline(row: tuple, edges: list[tuple[str, Any, Any]]) -> PipelineInfo:
    """A pipeline row and its (block key, demand, consumed) rows in request order."""
    (
        id_,
        name,
        dataset_name,
        state,
        owner,
        weight,
        timeout,
        submitted_at,
        granted_at,
        started_at,
        finished_at,
        mechanism,
        job,
        resources,
        placement,
        message,
        elastic_min,
        fraction,
    ) = row
    demands = {key: demand for key, demand, _ in edges}
    consumed = {key: spent for key, _, spent in edges if spent is not None}
    return PipelineInfo(
        id=id_,
        name=name,
        dataset=dataset_name,
        state=PipelineState(state),
        owner=owner,
        weight=weight,
        timeout=timeout,
        submitted_at=submitted_at,
        granted_at=granted_at,
        started_at=started_at,
        finished_at=finished_at,
        block_keys=list(demands),
        demands=demands,
        mechanism=mechanism,
        job=json.loads(job),
        resources=json.loads(resources),
        placement=json.loads(placement) if placement is not None else None,
        consumed=consumed or None,
        message=message,
        elastic_min=elastic_min,
        fraction=fraction,
    )


def event(row: tuple) -> Event:
    id_, at, kind, dataset_id, block_id, pipeline_id, source, target, amount, reason, detail, actor = row
    return Event(
        id=id_,
        at=at,
        kind=kind,
        dataset_id=dataset_id,
        block_id=block_id,
        pipeline_id=pipeline_id,
        source=source,
        target=target,
        amount=amount,
        reason=reason,
        detail=detail,
        actor=actor,
    )
