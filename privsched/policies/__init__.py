"""Scheduling policies: pure, vectorised functions from a snapshot to the pipelines to grant.

See docs/design.md §4. ``make_policy(name, ...)`` pairs an ordering with its unlock rule.
"""

from privsched.policies.admission import admit_in_order
from privsched.policies.base import Allocation, Policy, PolicySpec, Snapshot, UnlockRule
from privsched.policies.dpack import DPack
from privsched.policies.dpf import DominantPrivateBlockFairness, dpf_order
from privsched.policies.fcfs import FirstComeFirstServed
from privsched.policies.optimal import Optimal, OptimalResult, solve_optimal
from privsched.policies.registry import POLICY_ALIASES, POLICY_NAMES, UNLOCK_NAMES, make_policy
from privsched.policies.round_robin import RoundRobin
from privsched.policies.unlock import UnlockAll, UnlockPerArrival, UnlockPerTime

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
