"""The policy's :class:`~privsched.policies.base.Snapshot` of a ledger
:class:`~privsched.ledger.models.PendingView`: the one place where the ledger's rows, named
by database id, become the arrays a policy indexes (docs/design.md §4.2–4.3)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from privsched.ledger.models import PendingView
from privsched.policies.base import Snapshot


def snapshot_of(view: PendingView, clock: float = 0.0, reserved: np.ndarray | None = None) -> Snapshot:
    """The view as a policy snapshot at ``clock``. Edges point at the view's blocks by index
    (``view.block_ids`` ascends). ``reserved`` (E, K): round robin's water-filled
    reservations per edge, taken out of their blocks' unlocked budget (docs/design.md §4.2)."""
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
