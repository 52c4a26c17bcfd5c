"""The offline optimum: a mixed-integer program over the pending pipelines (docs/design.md §4.2).

Following DPack (Tholoniat et al., EuroSys'25 §3), maximise ``Σ_i w_i x_i`` over binary
``x_i`` (grant pipeline i) such that every block stays within its budget:
- basic accounting: ``Σ_i d_ijk x_i ≤ c_jk`` for every block j and dimension k;
- RDP: binary ``y_jα`` per block and live order, ``Σ_α y_jα ≥ 1``, and
  ``Σ_i d_ijα x_i ≤ c_jα + M_jα (1 − y_jα)`` with ``M_jα = Σ_i d_ijα + max(0, −c_jα)``
  (the extra term keeps an unchosen order free when unlocked budget is negative there).
Here ``c`` is the snapshot's unlocked budget. Solved with ``scipy.optimize.milp`` (HiGHS)
under a time limit; the result says whether optimality was proven and gives the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privsched.policies.admission import EdgeTable, admit, at_minimum
from privsched.policies.base import Allocation, Snapshot


@dataclass(frozen=True)
class OptimalResult:
    """The solver's answer: granted pipeline indices, their total weight, and the proof status."""

    granted: np.ndarray
    objective: float
    proven_optimal: bool
    bound: float


def _block_rows(table: EdgeTable, owner: np.ndarray, n_pipelines: int):
    """Sparse (B·K, P) matrix of per-block, per-dimension demand sums, rows indexed ``j·K + k``."""
    from scipy import sparse

    dims = table.demand.shape[1]
    rows = (table.block[:, None] * dims + np.arange(dims)).ravel()
    columns = np.repeat(owner, dims)
    matrix = sparse.csr_array((table.demand.ravel(), (rows, columns)), shape=(table.n_blocks * dims, n_pipelines))
    used = np.zeros(table.n_blocks * dims, dtype=bool)
    used[rows] = True
    return matrix, used


def solve_optimal(snapshot: Snapshot, time_limit: float = 60.0) -> OptimalResult:
    """Solve the allocation MILP on ``snapshot`` within ``time_limit`` seconds."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, milp

    if not time_limit > 0:
        raise ValueError(f"time_limit must be positive, got {time_limit!r}")
    n = snapshot.n_pipelines
    weight = np.asarray(snapshot.weight, dtype=float)
    if n == 0:
        return OptimalResult(np.zeros(0, dtype=np.intp), 0.0, True, 0.0)
    table = EdgeTable.of(snapshot)
    owner = np.asarray(snapshot.edge_pipeline, dtype=np.intp)
    demand_rows, used = _block_rows(table, owner, n)
    budget = np.asarray(snapshot.unlocked, dtype=float).ravel()
    admitting, available = EdgeTable.admitting(snapshot)
    upper = np.where(admitting.fits_alone(available, np.arange(n)), 1.0, 0.0)
    if not snapshot.accounting.is_rdp:
        keep = np.flatnonzero(used)
        constraints = [LinearConstraint(demand_rows[keep], -np.inf, budget[keep])]
        n_choice = 0
    else:
        live = table.live.ravel()
        keep = np.flatnonzero(used & live)
        n_choice = keep.size
        big = np.asarray(demand_rows.sum(axis=1)).ravel()[keep] + np.maximum(0.0, -budget[keep])
        selector = sparse.csr_array((big, (np.arange(n_choice), np.arange(n_choice))), shape=(n_choice, n_choice))
        capacity_rows = sparse.hstack([demand_rows[keep], selector], format="csr")
        blocks_used = np.unique(keep // table.demand.shape[1])
        pick = sparse.csr_array(
            (np.ones(n_choice), (np.searchsorted(blocks_used, keep // table.demand.shape[1]), np.arange(n_choice))),
            shape=(blocks_used.size, n_choice),
        )
        choice_rows = sparse.hstack([sparse.csr_array((blocks_used.size, n)), pick], format="csr")
        constraints = [
            LinearConstraint(capacity_rows, -np.inf, budget[keep] + big),
            LinearConstraint(choice_rows, 1.0, np.inf),
        ]
        # A block whose requesting pipelines have no live order at all: none of them can run.
        dead = np.setdiff1d(np.unique(table.block), blocks_used)
        if dead.size:
            upper[np.unique(owner[np.isin(table.block, dead)])] = 0.0
    result = milp(
        c=np.r_[-weight, np.zeros(n_choice)],
        integrality=np.ones(n + n_choice),
        bounds=Bounds(np.zeros(n + n_choice), np.r_[upper, np.ones(n_choice)]),
        constraints=constraints,
        options={"time_limit": float(time_limit), "disp": False},
    )
    if result.x is None:
        return OptimalResult(np.zeros(0, dtype=np.intp), 0.0, False, float(weight.sum()))
    granted = np.flatnonzero(result.x[:n] > 0.5)
    bound = getattr(result, "mip_dual_bound", None)
    return OptimalResult(
        granted=granted,
        objective=float(weight[granted].sum()),
        proven_optimal=result.status == 0,
        bound=float(-bound) if bound is not None and np.isfinite(bound) else float(weight.sum()),
    )


@dataclass(frozen=True)
class Optimal:
    """Grants the MILP's solution on the snapshot's unlocked budget (offline evaluation only)."""

    time_limit: float = 60.0
    name: str = "optimal"

    def __post_init__(self) -> None:
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float)) or not self.time_limit > 0:
            raise ValueError(f"time_limit must be a positive number of seconds, got {self.time_limit!r}")

    def allocate(self, snapshot: Snapshot) -> Allocation:
        solution = solve_optimal(at_minimum(snapshot), self.time_limit).granted
        return admit(snapshot, solution)
