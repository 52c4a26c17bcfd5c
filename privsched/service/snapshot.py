"""The policy's :class:`~privsched.policies.base.Snapshot` of a ledger
:class:`~privsched.ledger.models.PendingView`: the one place where the ledger's rows, named
by database id, become the arrays a policy indexes (docs/design.md §4.2–4.3)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from privsched.ledger.models import PendingView
from privsched.ledger.quotas import TeamQuotas
from privsched.policies.base import Quotas, Snapshot


def quotas_of(view: PendingView, teams: TeamQuotas | None) -> Quotas | None:
    """The ledger's team quotas as arrays over the view's pipelines and blocks (teams in
    name order), or None without any."""
    if teams is None:
        return None
    names = sorted(teams.shares)
    index = {name: t for t, name in enumerate(names)}
    team = np.array([index.get(teams.teams.get(int(p), ""), -1) for p in view.pipelines.pipeline_ids.tolist()], dtype=np.intp)
    held = np.zeros((len(names), len(view.block_ids), view.accounting.dims))
    for name, blocks in teams.held.items():
        for block_id, amount in blocks.items():
            row = int(np.searchsorted(view.block_ids, block_id))
            if row < len(view.block_ids) and view.block_ids[row] == block_id:
                held[index[name], row] = amount
    return Quotas(team=team, share=np.array([teams.shares[n] for n in names], dtype=float), held=held)


def snapshot_of(view: PendingView, clock: float = 0.0, reserved: np.ndarray | None = None, teams: TeamQuotas | None = None) -> Snapshot:
    """The view as a policy snapshot at ``clock``. Edges point at the view's blocks by index
    (``view.block_ids`` ascends). ``reserved`` (E, K): round robin's water-filled
    reservations per edge, taken out of their blocks' unlocked budget (docs/design.md §4.2).
    ``teams``: the quotas the view's pipelines meet (:meth:`privsched.ledger.Ledger.team_quotas`)."""
    pipelines = view.pipelines
    edge_block = np.searchsorted(view.block_ids, pipelines.edge_block)
    unlocked = view.unlocked
    if reserved is not None:
        per_block = np.zeros_like(unlocked)
        np.add.at(per_block, edge_block, reserved)
        unlocked = unlocked - per_block
    return Snapshot(
        accounting=view.accounting,
        capacity=view.capacity,
        unlocked=unlocked,
        pipeline_ids=pipelines.pipeline_ids,
        arrival=pipelines.arrival,
        weight=pipelines.weight,
        edge_pipeline=pipelines.edge_pipeline,
        edge_block=edge_block,
        edge_demand=pipelines.edge_demand,
        clock=clock,
        reserved=reserved,
        quotas=quotas_of(view, teams),
        elastic_min=pipelines.elastic_min,
    )


def edge_keys(view: PendingView) -> list[tuple[int, int]]:
    """(pipeline id, block id) of every edge of the view."""
    pipelines = view.pipelines
    return list(zip(pipelines.pipeline_ids[pipelines.edge_pipeline].tolist(), pipelines.edge_block.tolist()))


def edge_reservations(view: PendingView, reserved: Mapping[tuple[int, int], np.ndarray]) -> np.ndarray | None:
    """Round robin's reservations ``reserved`` (by pipeline id and block id) on the view's
    edges (E, K), or None when there are none."""
    if not reserved:
        return None
    zero = np.zeros(view.accounting.dims)
    return np.array([reserved.get(k, zero) for k in edge_keys(view)]).reshape(-1, view.accounting.dims)
