"""Policy names and the one function that builds a policy with its unlock rule (docs/design.md §4)."""

from __future__ import annotations

from privsched.policies.base import Policy, PolicySpec, UnlockRule
from privsched.policies.unlock import UnlockAll, UnlockPerArrival, UnlockPerTime

POLICY_NAMES: tuple[str, ...] = ("fcfs", "rr-n", "rr-t", "dpf-n", "dpf-t", "dpack", "dpack-n", "dpack-t", "optimal")
UNLOCK_NAMES: tuple[str, ...] = ("all", "n", "t")

#: Names that are another policy with its unlock rule fixed: DPack per arrival or per time.
POLICY_ALIASES: dict[str, tuple[str, str]] = {"dpack-n": ("dpack", "n"), "dpack-t": ("dpack", "t")}

#: The unlock rule each policy name pairs with by default ("dpack" depends on its parameters).
_DEFAULT_UNLOCK = {"fcfs": "all", "rr-n": "n", "rr-t": "t", "dpf-n": "n", "dpf-t": "t", "optimal": "all"}


def _unlock_rule(kind: str, name: str, n: int | None, lifetime: float | None) -> tuple[UnlockRule, dict]:
    if kind == "all":
        return UnlockAll(), {}
    if kind == "n":
        if n is None:
            raise ValueError(f"policy {name!r} with per-arrival unlocking needs n (the fair-share divisor)")
        return UnlockPerArrival(n), {"n": n}
    if lifetime is None:
        raise ValueError(f"policy {name!r} with per-time unlocking needs lifetime (seconds)")
    return UnlockPerTime(lifetime), {"lifetime": lifetime}


def _policy(name: str, k: int, time_limit: float, fair_share: float | None) -> tuple[Policy, dict]:
    """The policy ``name`` with its parameters; only its own module is imported.
    ``fair_share`` (1/N under per-arrival unlocking) caps elastic top-ups."""
    if name == "fcfs":
        from privsched.policies.fcfs import FirstComeFirstServed

        return FirstComeFirstServed(fair_share=fair_share), {}
    if name.startswith("rr-"):
        from privsched.policies.round_robin import RoundRobin

        return RoundRobin(name=name), {}
    if name.startswith("dpf-"):
        from privsched.policies.dpf import DominantPrivateBlockFairness

        return DominantPrivateBlockFairness(name=name, fair_share=fair_share), {}
    if name == "dpack":
        from privsched.policies.dpack import DPack

        return DPack(k=k, fair_share=fair_share), {"k": k}
    from privsched.policies.optimal import Optimal

    return Optimal(time_limit=time_limit), {"time_limit": time_limit}


def make_policy(
    name: str,
    *,
    n: int | None = None,
    lifetime: float | None = None,
    k: int = 50,
    unlock: str | None = None,
    time_limit: float = 60.0,
) -> PolicySpec:
    """Build the policy ``name`` paired with its unlock rule.

    fcfs and optimal unlock everything; rr-n / dpf-n unlock per arrival (needs ``n``);
    rr-t / dpf-t per time (needs ``lifetime``); dpack per time when ``lifetime`` is given,
    else per arrival when ``n`` is given, else everything; dpack-n / dpack-t are DPack per
    arrival / per time. ``unlock`` ("all", "n", "t") overrides the pairing (not an alias's).
    ``k`` is DPack's number of best-effort passes, ``time_limit`` the optimal solver's
    seconds. Parameters the chosen rule does not use are ignored. The live scheduler
    (``serve``) and the simulator (``simulate``) both build their policy here.
    Raises ValueError with one line for an unknown name or a missing or invalid parameter.
    """
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown policy {name!r} (expected one of: {', '.join(POLICY_NAMES)})")
    if unlock is not None and unlock not in UNLOCK_NAMES:
        raise ValueError(f"unknown unlock rule {unlock!r} (expected one of: {', '.join(UNLOCK_NAMES)})")
    base = name
    if name in POLICY_ALIASES:
        base, fixed = POLICY_ALIASES[name]
        if unlock not in (None, fixed):
            raise ValueError(f"policy {name!r} always unlocks with rule {fixed!r}, not {unlock!r}")
        unlock = fixed
    if unlock is None:
        unlock = _DEFAULT_UNLOCK.get(base) or ("t" if lifetime is not None else "n" if n is not None else "all")
    rule, unlock_params = _unlock_rule(unlock, name, n, lifetime)
    per_arrival = rule.on_pipeline_arrival()
    policy, policy_params = _policy(base, k, time_limit, per_arrival if per_arrival > 0 else None)
    return PolicySpec(name=name, policy=policy, unlock=rule, params={"unlock": unlock, **unlock_params, **policy_params})
