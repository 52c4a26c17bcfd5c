"""Pending pipelines that no future unlock can satisfy (docs/design.md §3.3, §4.4).

Whatever happens later, a block can never give out more than it has not consumed: unlocking
only moves locked budget to unlocked, and settling a job returns at most its allocation, so
``unlocked ≤ capacity − consumed`` forever (the admin act of releasing a failed job's budget
aside). A pending pipeline whose demand does not fit ``capacity − consumed`` on one of its
blocks (under RDP: at no live order; under basic: in ε or in δ), or that asks for a retired
block, can never be granted, and ends with that reason instead of waiting forever. An
elastic pipeline is tested with the least it accepts, its ``elastic_min`` × its demand
(docs/design.md §10).

The test leans towards waiting: the remainder is widened by a relative ``1e-9`` so that
floating-point rounding never ends a pipeline that could fit; it only decides to stop
waiting and never grants budget.
"""

from __future__ import annotations

import numpy as np

from privsched.ledger.models import BlockInfo, PendingView

#: Relative widening of a block's remainder before declaring a demand hopeless.
_ROUNDING = 1e-9


def never_grantable(view: PendingView, blocks: dict[int, BlockInfo]) -> dict[int, str]:
    """Pending pipeline id → why it can never be granted, for those of ``view`` that cannot
    (``blocks``: at least every block the view's pipelines ask for, by id)."""
    accounting, pipelines = view.accounting, view.pipelines
    if not len(pipelines.edge_block):
        return {}
    ids, edge = np.unique(pipelines.edge_block, return_inverse=True)
    rows = [blocks[block_id] for block_id in ids.tolist()]
    capacity = np.stack([block.capacity for block in rows])
    left = capacity - np.stack([block.consumed for block in rows]) + _ROUNDING * np.abs(capacity)
    active = np.array([block.state == "active" for block in rows])
    least = pipelines.edge_demand * pipelines.minimums()[pipelines.edge_pipeline][:, None]
    hopeful = active[edge] & accounting.fits(least, left[edge], accounting.live(capacity[edge]))
    reasons: dict[int, str] = {}
    where = "at every live order" if accounting.is_rdp else "in ε or δ"
    for i in np.flatnonzero(~hopeful).tolist():
        pipeline_id = int(pipelines.pipeline_ids[pipelines.edge_pipeline[i]])
        block = rows[edge[i]]
        if block.state != "active":
            reasons.setdefault(pipeline_id, f"can never be granted: block {block.key!r} is {block.state}")
        else:
            reasons.setdefault(pipeline_id, f"can never be granted: its demand exceeds what block {block.key!r} has not consumed {where}")
    return reasons
