"""Offline instances: every pipeline waiting at once on fully unlocked blocks, one pass per
policy, compared with the MILP optimum (docs/design.md §4.2; DPack, Tholoniat et al. EuroSys'25 §6.1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from privsched.policies.base import Policy, Snapshot
from privsched.simulation.instance import Instance


def offline_snapshot(instance: Instance) -> Snapshot:
    """All of the instance's pipelines pending, every block fully unlocked."""
    everyone = np.arange(len(instance.pipeline_ids))
    snapshot, _ = instance.snapshot(
        everyone,
        instance.capacity.copy(),
        clock=float(instance.arrival.max(initial=0.0)),
        reserved=np.zeros_like(instance.edge_demand),
    )
    return snapshot


@dataclass(frozen=True)
class OfflineComparison:
    """Granted weight per policy on one offline instance, and the optimum."""

    pipelines: int
    granted: dict[str, float]  # policy -> total weight granted
    optimum: float
    proven_optimal: bool
    bound: float
    solve_s: float

    def gap(self, policy: str) -> float:
        """Relative distance to the optimum's bound: ``(bound − granted) / bound``."""
        return (self.bound - self.granted[policy]) / self.bound if self.bound > 0 else 0.0


def compare_offline(instance: Instance, policies: dict[str, Policy], time_limit: float = 60.0) -> OfflineComparison:
    """One pass of each policy (name -> policy object) and the MILP on ``instance``."""
    from privsched.policies import solve_optimal

    snapshot = offline_snapshot(instance)
    granted = {}
    for name, policy in policies.items():
        chosen = np.asarray(policy.allocate(snapshot).granted, dtype=np.intp)
        granted[name] = float(instance.weight[chosen].sum())
    started = time.perf_counter()
    optimal = solve_optimal(snapshot, time_limit=time_limit)
    return OfflineComparison(
        pipelines=instance.n_pipelines,
        granted=granted,
        optimum=float(optimal.objective),
        proven_optimal=bool(optimal.proven_optimal),
        bound=float(optimal.bound),
        solve_s=time.perf_counter() - started,
    )
