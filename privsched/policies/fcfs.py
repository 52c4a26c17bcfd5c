"""First come, first served (docs/design.md §4.2): grant in arrival order, unlock everything."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from privsched.policies.admission import admit
from privsched.policies.base import Allocation, Snapshot


def arrival_rank(snapshot: Snapshot) -> np.ndarray:
    """Each pending pipeline's position in arrival order, ties broken by id (0 = first).
    Integer ids (the ledger's) compare as numbers, so that id 10 comes after id 9; any
    other ids (a trace's names) compare as text."""
    ids = np.asarray(snapshot.pipeline_ids)
    _, id_rank = np.unique(ids if ids.dtype.kind in "iu" else ids.astype(str), return_inverse=True)
    order = np.lexsort((id_rank, np.asarray(snapshot.arrival, dtype=float)))
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    return rank


@dataclass(frozen=True)
class FirstComeFirstServed:
    """Orders pending pipelines by arrival (ties by id) and admits best-effort."""

    name: str = "fcfs"
    #: Under per-arrival unlocking, 1/N: how far an elastic pipeline is topped up (as DPF's).
    fair_share: float | None = None
    per_pipeline_order: ClassVar[bool] = True

    def order(self, snapshot: Snapshot) -> np.ndarray:
        """Pending pipelines in arrival order (a :class:`~privsched.policies.base.PerPipelineOrder`)."""
        return np.argsort(arrival_rank(snapshot))

    def allocate(self, snapshot: Snapshot) -> Allocation:
        return admit(snapshot, self.order(snapshot), self.fair_share)
