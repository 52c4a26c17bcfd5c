"""The JSON documents the dashboard's pages poll, assembled from a :class:`~privsched.client.Client`.

Every value here is read from the ledger (budgets, states, timestamps) or from the run folder
the scheduler itself wrote (the log tail); nothing comes from a job's own report except the
metrics the job released, which only the readers :mod:`privsched.server.access` names see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.readout import as_epsilon_delta
from privsched.dashboard.bars import budget_bar, reference_dimension
from privsched.ledger import BlockInfo, DatasetInfo, PipelineInfo

if TYPE_CHECKING:
    from privsched.client import Client
    from privsched.service.waiting import WaitingReason

#: Which datasets the reader may see (by name).
Readable = Callable[[DatasetInfo], bool]

#: How many ended pipelines the queue page lists, newest first.
RECENT = 20
#: How many characters of a job log the pipeline page shows (the end of it).
LOG_TAIL = 4000


def _pair(vector: np.ndarray, dataset: DatasetInfo, capacity: np.ndarray) -> dict[str, float]:
    epsilon, delta = as_epsilon_delta(vector, dataset.accounting, capacity, dataset.delta)
    return {"epsilon": epsilon, "delta": delta}


def block_view(block: BlockInfo, dataset: DatasetInfo) -> dict[str, Any]:
    """One block: key, state, its bar and its remaining (ε, δ)."""
    return {
        "key": block.key,
        "state": block.state,
        "bar": budget_bar(block, dataset.accounting).to_dict(),
        "remaining": _pair(block.remaining, dataset, block.capacity),
    }


def budget_history(client: Client, dataset: DatasetInfo, blocks: list[BlockInfo]) -> list[dict[str, float]]:
    """The dataset's budget over time from the event log: after every budget move, the mean
    over the blocks that exist by then of (consumed) and (allocated + consumed) as fractions
    of capacity, each block read at its current reference dimension (``bars``)."""
    dimension = {block.id: reference_dimension(block, dataset.accounting) for block in blocks}
    capacity = {block.id: float(block.capacity[dimension[block.id]]) for block in blocks}
    consumed: dict[int, float] = {}
    allocated: dict[int, float] = {}
    history = []
    for event in client.events(dataset=dataset.name):
        if event.amount is None or event.block_id not in dimension:
            continue
        amount = float(event.amount[dimension[event.block_id]])
        for bucket, sign in ((event.source, -1.0), (event.target, 1.0)):
            if bucket == "consumed":
                consumed[event.block_id] = consumed.get(event.block_id, 0.0) + sign * amount
            elif bucket == "allocated":
                allocated[event.block_id] = allocated.get(event.block_id, 0.0) + sign * amount
        consumed.setdefault(event.block_id, 0.0)
        shares = [(consumed[b] / capacity[b], (consumed[b] + allocated.get(b, 0.0)) / capacity[b]) for b in consumed if capacity[b] > 0]
        history.append(
            {
                "at": event.at,
                "consumed": float(np.mean([s[0] for s in shares])) if shares else 0.0,
                "given_out": float(np.mean([s[1] for s in shares])) if shares else 0.0,
            }
        )
    return history


def blocks_page(client: Client, readable: Readable) -> list[dict[str, Any]]:
    """Every readable dataset with its blocks' bars and its budget over time."""
    page = []
    for dataset in filter(readable, client.datasets()):
        blocks = client.blocks(dataset.name)
        page.append(
            {
                "name": dataset.name,
                "accounting": dataset.accounting.name,
                "epsilon": dataset.epsilon,
                "delta": dataset.delta,
                "unit": dataset.unit_text(),
                "blocks": [block_view(block, dataset) for block in blocks],
                "history": budget_history(client, dataset, blocks),
            }
        )
    return page


def pipeline_row(info: PipelineInfo, message: str | None) -> dict[str, Any]:
    """What the queue lists of a pipeline (``message``: what the reader may see of its message)."""
    return {
        "id": info.id,
        "name": info.name,
        "dataset": info.dataset,
        "owner": info.owner,
        "state": info.state,
        "submitted_at": info.submitted_at,
        "granted_at": info.granted_at,
        "started_at": info.started_at,
        "finished_at": info.finished_at,
        "blocks": len(info.block_keys),
        "placement": info.placement,
        "message": message,
    }


def queue_page(
    client: Client, readable: Readable, reasons: dict[int, WaitingReason], message: Callable[[PipelineInfo], str | None]
) -> dict[str, Any]:
    """On the readable datasets: pending pipelines in the serving policy's order with why each
    waits (``reasons``, :mod:`privsched.service.waiting`), granted ones waiting for compute,
    running jobs with their placement, and the most recently ended pipelines; and what keeps
    the scheduler from making progress (``condition``: a full database or disk), or None."""
    names = {dataset.name for dataset in filter(readable, client.datasets())}
    pipelines = [info for info in client.list() if info.dataset in names]
    by_state: dict[str, list[PipelineInfo]] = {}
    for info in pipelines:
        by_state.setdefault(info.state, []).append(info)
    pending = sorted(
        by_state.get("pending", []), key=lambda info: (info.dataset, reasons[info.id].rank if info.id in reasons else 0, info.id)
    )
    ended = [info for info in pipelines if info.finished_at is not None]
    ended.sort(key=lambda info: info.finished_at or 0.0, reverse=True)

    def rows(infos: list[PipelineInfo]) -> list[dict[str, Any]]:
        return [pipeline_row(info, message(info)) for info in infos]

    return {
        "pending": [
            {**pipeline_row(info, message(info)), "reason": reasons[info.id].text() if info.id in reasons else None} for info in pending
        ],
        "granted": [
            {**pipeline_row(info, message(info)), "reason": reasons[info.id].text() if info.id in reasons else None}
            for info in by_state.get("granted", [])
        ],
        "running": rows(by_state.get("running", [])),
        "recent": rows(ended[:RECENT]),
        "condition": client.scheduler_condition(),
    }


def _curve(vector: np.ndarray, accounting: Accounting) -> list[dict[str, Any]]:
    return [{"dimension": label, "value": float(value)} for label, value in zip(accounting.dimension_labels(), vector)]


def pipeline_page(
    client: Client, info: PipelineInfo, message: str | None, *, outputs: bool, job_text: bool, reason: WaitingReason | None = None
) -> dict[str, Any]:
    """One pipeline: its row, why it waits (``reason``, pending or granted), spec (job and
    resources), charged demand against each block's capacity, consumed budget, and what its
    job released and wrote, as far as the reader may see them (docs/privacy.md): its metrics
    when ``outputs`` (:func:`privsched.server.access.can_read_outputs`), its log when
    ``job_text`` (:func:`~privsched.server.access.can_read_job_text`). ``metrics`` and
    ``log_tail`` are None when withheld."""
    pipeline_id = info.id
    dataset = next(d for d in client.datasets() if d.name == info.dataset)
    blocks = {block.key: block for block in client.blocks(info.dataset)}
    demands = []
    for key in info.block_keys:
        demand = info.demands[key]
        capacity = blocks[key].capacity if key in blocks else dataset.capacity
        demands.append(
            {
                "block": key,
                "demand": _pair(demand, dataset, capacity),
                "curve": _curve(demand, dataset.accounting),
                "capacity": _curve(capacity, dataset.accounting),
                "consumed": None if info.consumed is None else _pair(info.consumed[key], dataset, capacity),
            }
        )
    return {
        **pipeline_row(info, message),
        "waiting": None if reason is None else reason.text(),
        "job": info.job,
        "resources": info.resources,
        "mechanism": info.mechanism,
        "demands": demands,
        "metrics": client.run(pipeline_id).metrics if outputs else None,
        "log_tail": client.logs(pipeline_id)[-LOG_TAIL:] if job_text else None,
    }


def audit_page(client: Client) -> dict[str, Any]:
    """A fresh audit of the ledger."""
    report = client.audit()
    return {"ok": report.ok, "violations": report.violations, "blocks": report.blocks, "events": report.events, "head": report.head}
