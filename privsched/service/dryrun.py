"""What a submission would claim, without writing anything: the demand the pipeline would
be charged (its curve, and the ε that curve converts to on the dataset's orders at the
dataset's δ_G, as every charged curve is shown: :func:`~privsched.budgets.readout.as_epsilon_delta`),
and on each block whether it fits
the unlocked budget now, whether it could ever fit the capacity, and if not now, where it
falls short (:func:`privsched.service.waiting.shortfalls`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.budgets.readout import as_epsilon_delta
from privsched.ledger import BlockInfo, DatasetInfo, LedgerError, PipelineRequest
from privsched.service.waiting import shortfalls


@dataclass(frozen=True)
class BlockFit:
    key: str
    fits_now: bool
    fits_ever: bool  # the demand fits the block's capacity (else submission is refused)
    dimension: str | None = None  # where it falls shortest of the unlocked budget (if it does not fit now)
    shortfall: float | None = None


@dataclass(frozen=True)
class DryRun:
    name: str
    dataset: str
    demand: list[float]  # the charged curve (RDP, one ε(α) per order) or (ε, δ)
    labels: list[str]  # the dimension of each value: "α=2" ... or "ε", "δ"
    epsilon: float  # the ε the demand implies at ``delta`` (Balle et al. 2020, Thm. 21, under RDP)
    delta: float  # RDP: the dataset's δ_G; basic: the demand's δ
    blocks: list[BlockFit]

    def lines(self) -> list[str]:
        """The dry run as text, one line per block."""
        head = [f"pipeline {self.name} on {self.dataset}: demand ε={self.epsilon:.4g} at δ={self.delta:g}"]
        for fit in self.blocks:
            if fit.fits_now:
                state = "fits now"
            elif not fit.fits_ever:
                state = "can never fit (demand exceeds capacity)"
            else:
                state = f"does not fit now: {fit.dimension} short {fit.shortfall:.4g}"
            head.append(f"block {fit.key}: {state}")
        return head


def dry_run(request: PipelineRequest, dataset: DatasetInfo, blocks: list[BlockInfo]) -> DryRun:
    """The dry run of a built request (``build_request``) on the dataset's ``blocks``."""
    by_key = {b.key: b for b in blocks}
    missing = [k for k in request.block_keys if k not in by_key]
    if missing:
        raise LedgerError(f"unknown block {missing[0]!r} in dataset {dataset.name!r}")
    accounting = dataset.accounting
    chosen = [by_key[k] for k in request.block_keys]
    demand = np.asarray(request.demand, dtype=float)
    demands = np.tile(demand, (len(chosen), 1))
    capacity = np.stack([b.capacity for b in chosen])
    fits, dim, gap = shortfalls(accounting, demands, np.stack([b.unlocked for b in chosen]), capacity)
    ever = accounting.fits(demands, capacity, accounting.live(capacity))
    labels = accounting.dimension_labels()
    epsilon, at = as_epsilon_delta(demand, accounting, dataset.capacity, dataset.delta)
    fits_of = [
        BlockFit(b.key, bool(f), bool(e), None if f else labels[int(d)], None if f else float(g))
        for b, f, e, d, g in zip(chosen, fits, ever, dim, gap)
    ]
    return DryRun(request.name, dataset.name, demand.tolist(), labels, float(epsilon), float(at), fits_of)
