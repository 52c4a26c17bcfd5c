"""Budgets read as (ε, δ) for people: every block's balances (``privsched budget show``)
and a pipeline's demand and consumption per block (``privsched status``).

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
