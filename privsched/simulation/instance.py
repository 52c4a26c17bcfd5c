"""A workload compiled into the flat NumPy arrays the event loop runs on.

A trace is compiled by :func:`privsched.simulation.compile.compile_trace`, a generated
workload by :mod:`privsched.simulation.generated`; both give the same arrays.

Blocks and pipelines are sorted by arrival (stable, so equal times keep trace order), and
a pipeline's per-block demands are stored as *edges* grouped by pipeline, the layout of
:class:`privsched.policies.base.Snapshot`: pipeline i owns edges
``edge_start[i]:edge_start[i + 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.accounting import Accounting
from privsched.budgets.bounds import MAX_NOISE, MIN_NOISE, check_number
from privsched.budgets.curves import gaussian_curve, gaussian_sigma, pure_dp_curve
from privsched.policies.base import Quotas, Snapshot


@dataclass(frozen=True)
class Instance:
    """A compiled workload."""

    accounting: Accounting
    block_ids: np.ndarray  # (B,) str
    block_arrival: np.ndarray  # (B,) ascending
    capacity: np.ndarray  # (B, K)
    pipeline_ids: np.ndarray  # (P,) str
    arrival: np.ndarray  # (P,) ascending
    weight: np.ndarray  # (P,)
    timeout: np.ndarray  # (P,) seconds, inf when none
    klass: np.ndarray  # (P,) str, "" when unclassified
    edge_start: np.ndarray  # (P + 1,) offsets into the edge arrays
    edge_block: np.ndarray  # (E,) block index
    edge_demand: np.ndarray  # (E, K)
    #: Team quotas (docs/design.md §4.2): each pipeline's team (an index into ``share``, -1
    #: under none) and each team's share of every block's capacity; None without quotas.
    team: np.ndarray | None = None  # (P,) int
    share: np.ndarray | None = None  # (T,)
    #: Elastic demands (docs/design.md §4.2): the smallest fraction of ``edge_demand`` each
    #: pipeline accepts, in (0, 1]; None when every demand is fixed.
    elastic_min: np.ndarray | None = None  # (P,)

    @property
    def is_elastic(self) -> bool:
        """Whether some pipeline accepts less than its whole demand."""
        return self.elastic_min is not None and bool(np.any(self.elastic_min < 1))

    @property
    def has_quotas(self) -> bool:
        """Whether some pipeline is under a team quota."""
        return self.team is not None and self.share is not None and bool(np.any(self.team >= 0))

    @property
    def n_blocks(self) -> int:
        return len(self.block_ids)

    @property
    def n_pipelines(self) -> int:
        return len(self.pipeline_ids)

    @property
    def edge_pipeline(self) -> np.ndarray:
        """(E,) the pipeline owning each edge."""
        return np.repeat(np.arange(self.n_pipelines), np.diff(self.edge_start))

    def until(self, duration: float) -> Instance:
        """The blocks and pipelines that arrive before ``duration`` (a prefix of each)."""
        b = int(np.searchsorted(self.block_arrival, duration, side="left"))
        p = int(np.searchsorted(self.arrival, duration, side="left"))
        e = int(self.edge_start[p])
        return Instance(
            accounting=self.accounting,
            block_ids=self.block_ids[:b],
            block_arrival=self.block_arrival[:b],
            capacity=self.capacity[:b],
            pipeline_ids=self.pipeline_ids[:p],
            arrival=self.arrival[:p],
            weight=self.weight[:p],
            timeout=self.timeout[:p],
            klass=self.klass[:p],
            edge_start=self.edge_start[: p + 1],
            edge_block=self.edge_block[:e],
            edge_demand=self.edge_demand[:e],
            team=None if self.team is None else self.team[:p],
            share=self.share,
            elastic_min=None if self.elastic_min is None else self.elastic_min[:p],
        )

    def snapshot(
        self,
        pipelines: np.ndarray,
        unlocked: np.ndarray,
        clock: float = 0.0,
        reserved: np.ndarray | None = None,
        held: np.ndarray | None = None,
    ) -> tuple[Snapshot, np.ndarray]:
        """What a policy sees of ``pipelines`` (ascending, or in any order the policy may
        take as theirs) given the blocks' ``unlocked`` budget, and the pipelines' edges.
        ``reserved`` is per edge of the whole instance (E, K); ``held`` (T, B, K) what each
        team holds, under quotas."""
        edges, owner = self.edges_of(pipelines)
        snapshot = Snapshot(
            accounting=self.accounting,
            capacity=self.capacity,
            unlocked=unlocked,
            pipeline_ids=self.pipeline_ids[pipelines],
            arrival=self.arrival[pipelines],
            weight=self.weight[pipelines],
            edge_pipeline=owner,
            edge_block=self.edge_block[edges],
            edge_demand=self.edge_demand[edges],
            clock=clock,
            reserved=None if reserved is None else reserved[edges],
            quotas=None if held is None or self.team is None or self.share is None else Quotas(self.team[pipelines], self.share, held),
            elastic_min=self.elastic_min[pipelines] if self.is_elastic and self.elastic_min is not None else None,
        )
        return snapshot, edges

    def edges_of(self, pipelines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Edge indices of ``pipelines`` (in that order) and, per edge, its position in ``pipelines``."""
        starts = self.edge_start[pipelines]
        counts = self.edge_start[pipelines + 1] - starts
        owner = np.repeat(np.arange(len(pipelines)), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        return np.repeat(starts, counts) + (np.arange(len(owner)) - first), owner


def plain_demand(epsilon: float, delta: float, accounting: Accounting) -> np.ndarray:
    """The demand vector of a plain (ε, δ) in a workload: under RDP with δ > 0, the curve
    of the Gaussian mechanism calibrated to it, σ = sqrt(2 ln(1.25/δ))/ε (Dwork & Roth
    2014, Thm A.1; its RDP curve α/(2σ²), Mironov 2017, Prop. 7: the OSDI'21
    microbenchmarks' demand, docs/design.md §5.1); under RDP with δ = 0, the pure-DP curve
    min(ε, αε²/2) (Bun & Steinke 2016, Prop. 3.3); under basic accounting (ε, δ). These
    are the vectors :func:`~privsched.budgets.mechanisms.demand_vector` gives the
    ``Gaussian`` and ``EpsilonDelta`` descriptions."""
    if not accounting.is_rdp:
        return np.array([epsilon, delta])
    if delta > 0:
        sigma = check_number(gaussian_sigma(epsilon, delta), "the Gaussian noise calibrated to (epsilon, delta)", MIN_NOISE, MAX_NOISE)
        return gaussian_curve(sigma, accounting.alphas)
    return pure_dp_curve(epsilon, accounting.alphas)
