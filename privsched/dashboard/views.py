"""The JSON documents the dashboard's pages poll, assembled from a :class:`~privsched.client.Client`.

Every value here is read from the ledger (budgets, states, timestamps) or from the run folder
the scheduler itself wrote (the log tail); nothing comes from a job's own report except the
metrics the job released, which only the readers :mod:`privsched.server.access` names see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from privsched.budgets.readout import as_epsilon_delta
from privsched.dashboard.bars import budget_bar, reference_dimension
from privsched.ledger import BlockInfo, DatasetInfo, PipelineInfo

if TYPE_CHECKING:
    from privsched.client import Client
    from privsched.service.waiting import WaitingReason

#: Which datasets the reader may see (by name).
Readable = Callable[[DatasetInfo], bool]

#: How many ended pipelines the queue page lists, newest first (the pipelines page lists all).
RECENT = 20
#: Pipelines per page of the pipelines page, and the most a reader may ask for.
PAGE_SIZE = 25
MAX_PAGE_SIZE = 200
#: Metrics the pipelines page's result column shows of each pipeline, headline ones first.
RESULT_METRICS = 3
HEADLINE = ("value", "accuracy", "heldout_accuracy", "test_accuracy", "loss")
#: How many characters of a job log the pipeline page shows (the end of it).
LOG_TAIL = 4000


def _pair(vector: np.ndarray, dataset: DatasetInfo, capacity: np.ndarray) -> dict[str, float]:
    epsilon, delta = as_epsilon_delta(vector, dataset.accounting, capacity, dataset.delta)
    return {"epsilon": epsilon, "delta": delta}


def percent(fraction: float) -> float:
    """A share of capacity in percent, to one decimal (what every page prints)."""
    return round(100.0 * fraction, 1)


def block_view(block: BlockInfo, dataset: DatasetInfo) -> dict[str, Any]:
    """One block: key, state, its bar, the share of its capacity used (allocated + consumed)
    and left, in percent, which add up to 100 as printed, and its remaining (ε, δ): ε at the
    dataset's δ_G under RDP (docs/design.md §3.1)."""
    bar = budget_bar(block, dataset.accounting)
    used = percent(bar.consumed + bar.allocated)
    return {
        "key": block.key,
        "state": block.state,
        "bar": bar.to_dict(),
        "used_percent": used,
        "left_percent": round(100.0 - used, 1),
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
        "block_keys": list(info.block_keys),
        "placement": placement_text(info.placement),
        "message": message,
    }


def placement_text(placement: dict[str, Any] | None) -> str:
    """Where a job runs, in words: ``executor local, host h1, GPUs 0, 1``."""
    if not placement:
        return ""
    parts = []
    for key, value in placement.items():
        shown = ", ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
        parts.append(f"{key.replace('_', ' ')} {shown or 'none'}")
    return "; ".join(parts)


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def metric_rows(metrics: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A job's metrics as (name, value) rows, nested names joined with ``.``, lists of
    scalars joined with commas: a table, never raw JSON."""
    rows: list[tuple[str, str]] = []
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows.extend(metric_rows(value, name + "."))
        elif isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
            rows.append((name, ", ".join(map(_scalar, value))))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                rows.extend(metric_rows(item if isinstance(item, dict) else {"": item}, f"{name}[{index}]."))
        else:
            rows.append((name.rstrip("."), _scalar(value)))
    return rows


def result_text(info: PipelineInfo, message: str | None, metrics: Callable[[PipelineInfo], dict[str, Any] | None]) -> str:
    """The pipelines page's result column: a completed pipeline's headline metrics (value,
    accuracy, loss, then the first others; unset ones left out) as far as the reader may read
    them (``metrics`` None when withheld), an ended one's reason."""
    if info.state == "completed":
        released = metrics(info)
        if released is None:
            return "(shown to its submitter and admins)"
        rows = [row for row in metric_rows(released) if row[1] != "None"]
        rows.sort(key=lambda row: HEADLINE.index(row[0]) if row[0] in HEADLINE else len(HEADLINE))  # stable: the rest in order
        shown = ", ".join(f"{name} = {value}" for name, value in rows[:RESULT_METRICS])
        return shown + (f" (+{len(rows) - RESULT_METRICS} more)" if len(rows) > RESULT_METRICS else "") or "(no metrics)"
    return message or "" if info.state.is_final() else ""


def _matches(info: PipelineInfo, search: str) -> bool:
    needle = search.casefold()
    return any(needle in text.casefold() for text in (str(info.id), info.name, info.owner, info.dataset, *info.block_keys))


def pipelines_page(
    client: Client,
    readable: Readable,
    message: Callable[[PipelineInfo], str | None],
    metrics: Callable[[PipelineInfo], dict[str, Any] | None],
    *,
    state: str | None = None,
    owner: str | None = None,
    dataset: str | None = None,
    search: str | None = None,
    page: int = 1,
    per_page: int = PAGE_SIZE,
) -> dict[str, Any]:
    """Every pipeline on the readable datasets, newest first, filtered by state, owner,
    dataset and a search over id, name, owner, dataset and block keys, one page of
    ``per_page`` rows (``page`` from 1) with a result column (:func:`result_text`); and the
    choices the filters offer, and how many pipelines match (so every one is reachable)."""
    names = sorted(d.name for d in filter(readable, client.datasets()))
    shown_sets = frozenset(names)
    every = [info for info in client.list() if info.dataset in shown_sets]
    found = [
        info
        for info in every
        if (state is None or info.state == state)
        and (owner is None or info.owner == owner)
        and (dataset is None or info.dataset == dataset)
        and (not search or _matches(info, search))
    ]
    found.sort(key=lambda info: info.id, reverse=True)
    pages = max(1, -(-len(found) // per_page))
    page = min(max(page, 1), pages)
    shown = found[(page - 1) * per_page : page * per_page]
    rows = []
    for info in shown:
        visible = message(info)
        rows.append({**pipeline_row(info, visible), "result": result_text(info, visible, metrics)})
    return {
        "rows": rows,
        "total": len(found),
        "page": page,
        "pages": pages,
        "per_page": per_page,
        "choices": {
            "state": sorted({info.state.value for info in every}),
            "owner": sorted({info.owner for info in every}),
            "dataset": names,
        },
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


def demand_view(key: str, demand: np.ndarray, block: BlockInfo | None, dataset: DatasetInfo, consumed: np.ndarray | None) -> dict[str, Any]:
    """A pipeline's demand on one block in the reader's terms: ε at the dataset's δ_G and the
    share of the block's capacity it takes, what the block has left, what was consumed; read
    at the block's reference dimension (``bars``) so the shares compare; and, one level down,
    the RDP detail: demand and what is left at each live order."""
    accounting = dataset.accounting
    capacity = block.capacity if block is not None else dataset.capacity
    remaining = block.remaining if block is not None else capacity
    dimension = reference_dimension(block, accounting) if block is not None else 0
    scale = float(capacity[dimension])
    live = accounting.live(capacity)
    labels = accounting.dimension_labels()
    return {
        "block": key,
        "dimension": labels[dimension],
        "demand": _pair(demand, dataset, capacity),
        "demand_percent": percent(float(demand[dimension]) / scale) if scale > 0 else None,
        "left_percent": percent(max(float(remaining[dimension]), 0.0) / scale) if scale > 0 else None,
        "consumed": None if consumed is None else _pair(consumed, dataset, capacity),
        "consumed_percent": None if consumed is None or scale <= 0 else percent(float(consumed[dimension]) / scale),
        "detail": [
            {"dimension": labels[i], "demand": float(demand[i]), "left": float(remaining[i])} for i in range(len(labels)) if live[i]
        ],
    }


def job_rows(job: dict[str, Any], resources: dict[str, Any]) -> list[tuple[str, str]]:
    """What a pipeline runs and needs, as (field, value) rows, without the fields left unset."""
    rows = [(f"job {name}", value) for name, value in metric_rows(job)] + [
        (f"needs {name}", value) for name, value in metric_rows(resources)
    ]
    return [(name, value) for name, value in rows if value not in ("None", "")]  # fields left unset


def pipeline_page(
    client: Client, info: PipelineInfo, message: str | None, *, outputs: bool, job_text: bool, reason: WaitingReason | None = None
) -> dict[str, Any]:
    """One pipeline: its row, why it waits (``reason``, pending or granted), what it runs and
    needs, its demand on each block in the reader's terms (:func:`demand_view`), and what its
    job released and wrote, as far as the reader may see them (docs/privacy.md): its result
    (metrics, primitives' releases, charge, artifacts) when ``outputs``
    (:func:`privsched.server.access.can_read_outputs`), its log when ``job_text``
    (:func:`~privsched.server.access.can_read_job_text`). ``result`` and ``log_tail`` are
    None when withheld; ``result`` is None too until the pipeline has ended."""
    dataset = next(d for d in client.datasets() if d.name == info.dataset)
    blocks = {block.key: block for block in client.blocks(info.dataset)}
    demands = [
        demand_view(key, info.demands[key], blocks.get(key), dataset, None if info.consumed is None else info.consumed.get(key))
        for key in info.block_keys
    ]
    result = client.result(info.id) if outputs and info.state.is_final() else None
    return {
        **pipeline_row(info, message),
        "waiting": None if reason is None else reason.text(),
        "job": job_rows(info.job, info.resources),
        "accounting": dataset.accounting.name,
        "delta": dataset.delta,
        "demands": demands,
        "outputs": outputs,
        "result": None
        if result is None
        else {
            "epsilon": result.epsilon,
            "metrics": metric_rows(result.metrics),
            "releases": result.releases,
            "first_access": result.first_access,
            "artifacts": [{"name": a.name, "size": a.size} for a in result.artifacts],
        },
        "log_tail": client.logs(info.id)[-LOG_TAIL:] if job_text else None,
    }


def teams_page(
    client: Client, readable: Readable, teams: Callable[[list[int]], dict[int, str]], quotas: Callable[[DatasetInfo], dict[str, float]]
) -> list[dict[str, Any]]:
    """Every readable dataset's teams: each team's quota (the share of every block's capacity
    it may hold, None: no cap; :mod:`privsched.ledger.quotas`), the share it holds (demand of
    its granted and running pipelines plus what its ended ones consumed) and the share it
    consumed on its most-held block, at each block's reference dimension (``bars``), and how
    many pipelines it has. ``teams`` names the team each pipeline was submitted for (those
    submitted without one, locally, count under no team)."""
    page = []
    for dataset in filter(readable, client.datasets()):
        blocks = {block.key: block for block in client.blocks(dataset.name)}
        scale = {key: float(b.capacity[reference_dimension(b, dataset.accounting)]) for key, b in blocks.items()}
        index = {key: reference_dimension(b, dataset.accounting) for key, b in blocks.items()}
        pipelines = client.list(dataset=dataset.name)
        team_of = teams([info.id for info in pipelines])
        shares = quotas(dataset)
        held: dict[str, dict[str, float]] = {team: {} for team in shares}
        consumed: dict[str, dict[str, float]] = {team: {} for team in shares}
        count: dict[str, int] = dict.fromkeys(shares, 0)
        for info in pipelines:
            team = team_of.get(info.id)
            if team is None:
                continue
            held.setdefault(team, {})
            consumed.setdefault(team, {})
            count[team] = count.get(team, 0) + 1
            for key in info.block_keys:
                if key not in blocks or scale[key] <= 0:
                    continue
                if info.state in ("granted", "running"):
                    amount = float(info.demands[key][index[key]]) / scale[key]
                elif info.consumed is not None and key in info.consumed:
                    amount = float(info.consumed[key][index[key]]) / scale[key]
                    consumed[team][key] = consumed[team].get(key, 0.0) + amount
                else:
                    continue
                held[team][key] = held[team].get(key, 0.0) + amount
        page.append(
            {
                "name": dataset.name,
                "teams": [
                    {
                        "team": team,
                        "quota_percent": None if team not in shares else percent(shares[team]),
                        "held_percent": percent(max(held[team].values(), default=0.0)),
                        "consumed_percent": percent(max(consumed[team].values(), default=0.0)),
                        "pipelines": count.get(team, 0),
                    }
                    for team in sorted(held)
                ],
            }
        )
    return page


def audit_page(client: Client) -> dict[str, Any]:
    """A fresh audit of the ledger."""
    report = client.audit()
    return {"ok": report.ok, "violations": report.violations, "blocks": report.blocks, "events": report.events, "head": report.head}
