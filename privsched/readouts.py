"""Budgets read as (ε, δ) for people: every block's balances (``privsched budget show``)
and a pipeline's demand and consumption per block (``privsched status``), and each as a
share of the block's capacity (:func:`block_shares`, :func:`demand_share`).

The local and the remote client share these reads (:class:`BudgetReads`): both compute
them here from what the ledger records about budgets and grants, which the privacy
guarantee treats as public (docs/privacy.md). Under basic accounting a vector
is (ε, δ) already; under RDP a curve is read as the ε it guarantees at the dataset's δ_G
(:func:`privsched.budgets.readout.as_epsilon_delta`, the conversion of docs/design.md §3.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from privsched.ledger.models import BlockInfo, DatasetInfo, PipelineInfo


@dataclass(frozen=True)
class Readout:
    """A budget as the (ε, δ) guarantee it stands for."""

    epsilon: float
    delta: float


def readout(vector: np.ndarray, dataset: DatasetInfo) -> Readout:
    """``vector`` (a block's balance or a demand on one of ``dataset``'s blocks) as (ε, δ)."""
    from privsched.budgets.readout import as_epsilon_delta  # NumPy: not at import (the remote CLI)

    return Readout(*as_epsilon_delta(vector, dataset.accounting, dataset.capacity, dataset.delta))


@dataclass(frozen=True)
class Shares:
    """A block's budget as fractions of its capacity, all read in one dimension (``at``), so
    that ``consumed + allocated + left = 1`` and ``left = locked + unlocked``."""

    at: str  # the dimension read: "α=8" under RDP, "ε" or "δ" under basic accounting
    consumed: float
    allocated: float
    left: float  # capacity − allocated − consumed, not yet given out
    unlocked: float  # the part of ``left`` grantable now


def block_shares(block: BlockInfo, dataset: DatasetInfo) -> Shares:
    """``block``'s balances as fractions of its capacity in the dimension that bounds what it
    can still give: under RDP the live order with the largest share left (a demand fits the
    block if it fits at some live order, docs/design.md §3.3; Luo et al., OSDI'21 §4.2),
    under basic accounting the one of ε and δ with the smallest share left (a demand must
    fit both). A block with no live order has nothing left."""
    import numpy as np

    accounting = dataset.accounting
    capacity = np.asarray(block.capacity, dtype=float)
    live = accounting.live(capacity) & (capacity > 0)
    if not live.any():
        return Shares("-", 1.0, 0.0, 0.0, 0.0)
    left = accounting.shares(block.remaining, capacity)
    if accounting.is_rdp:
        index = int(np.argmax(np.where(live, left, -np.inf)))
    else:
        index = int(np.argmin(np.where(live, left, np.inf)))
    scale = capacity[index]
    return Shares(
        accounting.dimension_labels()[index],
        float(block.consumed[index] / scale),
        float(block.allocated[index] / scale),
        float(block.remaining[index] / scale),
        float(block.unlocked[index] / scale),
    )


def demand_share(demand: np.ndarray, dataset: DatasetInfo) -> float:
    """The fraction of a block's capacity that ``demand`` takes: under RDP its smallest share
    over the live orders (the order where it costs the block least, where an RDP demand is
    served, docs/design.md §3.3), under basic accounting its larger share of ε and δ (both
    must fit). Infinite for a demand no live order can hold."""
    import numpy as np

    capacity = dataset.capacity
    live = dataset.accounting.live(capacity) & (np.asarray(capacity) > 0)
    if not live.any():
        return float("inf")
    shares = dataset.accounting.shares(demand, capacity)[live]
    return float(shares.min() if dataset.accounting.is_rdp else shares.max())


def demand_text(epsilon: float, share: float, key: str) -> str:
    """A demand on one block as people read it: "ε = 0.1 → 1.1 % of block 2026-11-08"."""
    taken = "more than its capacity" if share > 1 else f"{100 * share:.2g} %"
    return f"ε = {epsilon:.4g} → {taken} of block {key}"


def tenths(parts: tuple[float, ...]) -> tuple[int, ...]:
    """Fractions that sum to 1 as whole tenths of a percent that sum to exactly 1000, each
    within 0.1 % of its value (largest remainder rounding, Hamilton's method): the
    percentages printed for a block add up to 100.0 %."""
    scaled = [max(part, 0.0) * 1000 for part in parts]
    total = sum(scaled)
    if total <= 0:
        return tuple(0 for _ in parts)
    scaled = [value * 1000 / total for value in scaled]
    floors = [int(value) for value in scaled]
    order = sorted(range(len(parts)), key=lambda i: scaled[i] - floors[i], reverse=True)
    for i in order[: 1000 - sum(floors)]:
        floors[i] += 1
    return tuple(floors)


@dataclass(frozen=True)
class QuotaUsage:
    """A team's quota on a dataset and how much of it is taken, each as a share of a block's
    capacity: the largest over the dataset's blocks of :func:`demand_share`."""

    dataset: str
    team: str
    share: float  # the quota: the share of each block's capacity the team may hold
    held: float  # granted, running and consumed
    consumed: float  # the part of ``held`` spent for good


def _balance(name: str) -> cached_property[Readout]:
    """A :class:`BlockBalances` attribute: the block's balance ``name`` as (ε, δ), read once."""

    def read(balances: BlockBalances) -> Readout:
        return readout(getattr(balances.block, name), balances.dataset)

    return cached_property(read)


@dataclass(frozen=True, eq=False)
class BlockBalances:
    """One block's locked, unlocked, allocated, consumed and remaining budget as (ε, δ), each
    read when first asked for: ``budget show`` converts only the rows it prints."""

    block: BlockInfo
    dataset: DatasetInfo  # the block's

    locked = _balance("locked")
    unlocked = _balance("unlocked")
    allocated = _balance("allocated")
    consumed = _balance("consumed")
    remaining = _balance("remaining")  # capacity − allocated − consumed


@dataclass(frozen=True)
class DatasetBalances:
    """A dataset and its blocks' balances, oldest block first."""

    dataset: DatasetInfo
    blocks: list[BlockBalances]


@dataclass(frozen=True)
class BlockGrant:
    """A pipeline's demand on one block and, once it has ended, what it consumed there."""

    key: str
    demand: Readout
    consumed: Readout | None


def pipeline_grants(info: PipelineInfo, dataset: DatasetInfo) -> list[BlockGrant]:
    """The demand (and consumption) of pipeline ``info`` on each of its blocks, in its order."""
    return [
        BlockGrant(key, readout(info.demands[key], dataset), None if info.consumed is None else readout(info.consumed[key], dataset))
        for key in info.block_keys
    ]


class _Reads(Protocol):
    """What a client answers that :class:`BudgetReads` builds on."""

    def datasets(self) -> list[DatasetInfo]: ...

    def dataset(self, name: str) -> DatasetInfo: ...

    def blocks(self, dataset: str | None = None, *, active_only: bool = False) -> list[BlockInfo]: ...

    def status(self, pipeline_id: int) -> PipelineInfo: ...


class BudgetReads:
    """The budget reads of a client, built on its ``datasets``, ``dataset``, ``blocks`` and
    ``status`` methods, so that the local and the remote client answer them alike."""

    def balances(self: _Reads, dataset: str | None = None) -> list[DatasetBalances]:
        """Every block's balances as (ε, δ), per dataset (only ``dataset``'s when given)."""
        datasets = [self.dataset(dataset)] if dataset is not None else self.datasets()
        return [DatasetBalances(info, [BlockBalances(block, info) for block in self.blocks(info.name)]) for info in datasets]

    def grants(self: _Reads, pipeline_id: int) -> tuple[PipelineInfo, DatasetInfo, list[BlockGrant]]:
        """A pipeline, its dataset, and its demand and consumption per block as (ε, δ)."""
        info = self.status(pipeline_id)
        dataset = self.dataset(info.dataset)
        return info, dataset, pipeline_grants(info, dataset)
