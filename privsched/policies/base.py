"""The contract between scheduling policies and their callers (simulator and live scheduler).

A policy is a pure function from a :class:`Snapshot` to an :class:`Allocation`
(docs/design.md §4.2). Unlock rules (docs/design.md §4.1) are separate objects, so any ordering can be
combined with any unlock rule. Nothing here performs I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, TypeGuard

import numpy as np

from privsched.budgets.accounting import Accounting


@dataclass(frozen=True)
class Quotas:
    """Team quotas as a policy sees them: a team may hold at most ``share × capacity`` of
    each block (in the accounting's sense, like the ledger's own check,
    :mod:`privsched.ledger.quotas`), and already holds ``held`` (what its pipelines were
    granted and not given back). Teams are indexed 0..T-1."""

    team: np.ndarray  # (P,) int: each pending pipeline's team, -1 when under no quota
    share: np.ndarray  # (T,) each team's share of every block's capacity, in [0, 1]
    held: np.ndarray  # (T, B, K) what each team holds on each block

    def room(self, capacity: np.ndarray) -> np.ndarray:
        """What each team may still take on each block (T, B, K), in exact quanta
        (:func:`~privsched.budgets.exact.share_of`, rounded down; ``held`` rounded up)."""
        from privsched.budgets.exact import clamp, share_of, units

        limit = (
            np.stack([share_of(float(s), capacity) for s in self.share])
            if len(self.share)
            else np.zeros((0, *capacity.shape), dtype=np.int64)
        )
        return clamp(limit - units(self.held, up=True))


@dataclass(frozen=True)
class Snapshot:
    """Everything a policy may look at, as NumPy arrays.

    Blocks are indexed 0..B-1 and pending pipelines 0..P-1. A pipeline's per-block demands
    are stored as *edges* (one per requested block), grouped by pipeline in ascending
    pipeline order: edge e says pipeline ``edge_pipeline[e]`` wants ``edge_demand[e]`` on
    block ``edge_block[e]``. K is ``accounting.dims``.
    """

    accounting: Accounting
    capacity: np.ndarray  # (B, K) each block's total budget
    unlocked: np.ndarray  # (B, K) budget available to grant now (RDP: may be < 0 at some α)
    pipeline_ids: np.ndarray  # (P,) ids (ledger: int, trace: str), the last tie-break
    arrival: np.ndarray  # (P,) arrival times; arrival order is the second tie-break
    weight: np.ndarray  # (P,) profit of granting each pipeline (1 by default)
    edge_pipeline: np.ndarray  # (E,) int
    edge_block: np.ndarray  # (E,) int
    edge_demand: np.ndarray  # (E, K)
    clock: float = 0.0
    #: (E, K) budget already set aside for each edge by round robin's water-filling
    #: (zeros for every other policy).
    reserved: np.ndarray | None = None
    #: Team quotas (docs/design.md §4.2), or None when no pending pipeline is under one.
    quotas: Quotas | None = None
    #: (P,) elastic demands (docs/design.md §4.2, elastic demands): the smallest fraction,
    #: in (0, 1], of its edge demands (``edge_demand``, the pipeline's *maximum* demand,
    #: every RDP order alike) that each pending pipeline accepts. 1.0 is a fixed demand;
    #: None: all fixed.
    elastic_min: np.ndarray | None = None

    @property
    def n_pipelines(self) -> int:
        return len(self.pipeline_ids)

    @property
    def n_blocks(self) -> int:
        return self.capacity.shape[0]


@dataclass(frozen=True)
class Allocation:
    """A policy's decision: pipelines to grant (indices into the snapshot, in grant order),
    and, for water-filling policies, the new per-edge reservations (E, K).

    ``fraction`` (len(granted),) is the fraction of its edge demands each granted pipeline
    receives, in ``[elastic_min, 1]`` (None: 1.0 for all). A pipeline granted fraction f
    is charged ``f × edge_demand`` on every block it asked for: all or nothing at every
    block (docs/design.md §4.2, elastic demands).
    """

    granted: np.ndarray
    reserved: np.ndarray | None = None
    fraction: np.ndarray | None = None

    def fractions(self) -> np.ndarray:
        """(len(granted),) the fraction each granted pipeline receives (1.0 when fixed)."""
        if self.fraction is None:
            return np.ones(len(self.granted))
        return np.asarray(self.fraction, dtype=float)


class Policy(Protocol):
    """Orders and admits pending pipelines."""

    @property
    def name(self) -> str: ...

    def allocate(self, snapshot: Snapshot) -> Allocation: ...


class PerPipelineOrder(Protocol):
    """A policy whose order is a key of each pipeline alone (its demands, the capacities of
    its blocks, its arrival and id), and that admits best-effort in that order.

    The order of any subset of pipelines is then the order of the whole set restricted to
    the subset, so a caller may rank every pipeline once and sort any pending subset by
    that rank: ``allocate(s)`` grants what a best-effort pass over ``order(s)`` grants.
    Such a policy sets ``per_pipeline_order = True``.
    """

    name: str
    per_pipeline_order: ClassVar[bool]

    def allocate(self, snapshot: Snapshot) -> Allocation: ...

    def order(self, snapshot: Snapshot) -> np.ndarray:
        """The snapshot's pipeline indices in the policy's order."""
        ...


def orders_per_pipeline(policy: Policy) -> TypeGuard[PerPipelineOrder]:
    """Whether ``policy`` declares itself a :class:`PerPipelineOrder`."""
    return getattr(policy, "per_pipeline_order", False) is True


class UnlockRule(Protocol):
    """How locked budget becomes unlocked, as fractions of each block's capacity.

    Callers apply ``min(locked, fraction × capacity)`` at every dimension (docs/design.md §4.1).
    """

    @property
    def name(self) -> str: ...

    def on_block_created(self) -> float:
        """Fraction unlocked when a block is created (1.0 for "all", else 0.0)."""
        ...

    def on_pipeline_arrival(self) -> float:
        """Fraction unlocked on each block a newly arrived pipeline demands (1/N, or 0)."""
        ...

    def on_tick(self, elapsed: float | np.ndarray) -> float | np.ndarray:
        """Fraction unlocked on every block per ``elapsed`` seconds of clock (elapsed/L, or 0),
        element-wise for an array."""
        ...


@dataclass(frozen=True)
class PolicySpec:
    """A named pairing of a policy with its unlock rule, as found in the registry."""

    name: str
    policy: Policy
    unlock: UnlockRule
    params: dict = field(default_factory=dict)
