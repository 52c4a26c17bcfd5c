"""Scheduling policies: pure, vectorised functions from a snapshot to the pipelines to grant.

See docs/design.md §4. ``make_policy(name, ...)`` pairs an ordering with its unlock rule.
Names are imported on first use, and ``make_policy`` imports only the policy it builds,
so that a process running DPF does not load DPack or the optimal solver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from privsched.policies.admission import admit_in_order
    from privsched.policies.base import Allocation, Policy, PolicySpec, Snapshot, UnlockRule
    from privsched.policies.dpack import DPack
    from privsched.policies.dpf import DominantPrivateBlockFairness, dpf_order
    from privsched.policies.fcfs import FirstComeFirstServed
    from privsched.policies.optimal import Optimal, OptimalResult, solve_optimal
    from privsched.policies.registry import POLICY_ALIASES, POLICY_NAMES, UNLOCK_NAMES, make_policy
    from privsched.policies.round_robin import RoundRobin
    from privsched.policies.unlock import UnlockAll, UnlockPerArrival, UnlockPerTime

#: Public name -> module that defines it.
_API = {
    "POLICY_ALIASES": "privsched.policies.registry",
    "POLICY_NAMES": "privsched.policies.registry",
    "UNLOCK_NAMES": "privsched.policies.registry",
    "Allocation": "privsched.policies.base",
    "DPack": "privsched.policies.dpack",
    "DominantPrivateBlockFairness": "privsched.policies.dpf",
    "FirstComeFirstServed": "privsched.policies.fcfs",
    "Optimal": "privsched.policies.optimal",
    "OptimalResult": "privsched.policies.optimal",
    "Policy": "privsched.policies.base",
    "PolicySpec": "privsched.policies.base",
    "RoundRobin": "privsched.policies.round_robin",
    "Snapshot": "privsched.policies.base",
    "UnlockAll": "privsched.policies.unlock",
    "UnlockPerArrival": "privsched.policies.unlock",
    "UnlockPerTime": "privsched.policies.unlock",
    "UnlockRule": "privsched.policies.base",
    "admit_in_order": "privsched.policies.admission",
    "dpf_order": "privsched.policies.dpf",
    "make_policy": "privsched.policies.registry",
    "solve_optimal": "privsched.policies.optimal",
}

__all__ = [
    "POLICY_ALIASES",
    "POLICY_NAMES",
    "UNLOCK_NAMES",
    "Allocation",
    "DPack",
    "DominantPrivateBlockFairness",
    "FirstComeFirstServed",
    "Optimal",
    "OptimalResult",
    "Policy",
    "PolicySpec",
    "RoundRobin",
    "Snapshot",
    "UnlockAll",
    "UnlockPerArrival",
    "UnlockPerTime",
    "UnlockRule",
    "admit_in_order",
    "dpf_order",
    "make_policy",
    "solve_optimal",
]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)
