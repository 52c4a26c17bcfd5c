"""Small random traces for comparing the simulator with the live scheduler.

Times are multiples of 0.5 s so that many events share an instant (ties are where an
event order or a tie-break could differ); every pipeline names blocks that exist when it
arrives, some have timeouts, and demands range from a sliver to most of a block.
"""

from __future__ import annotations

import numpy as np

from privsched.simulation.trace import Trace

#: (ε_G, δ_G) of every block, per accounting mode.
GLOBAL_BUDGET = {"basic": (1.0, 1e-6), "rdp": (10.0, 1e-7)}


def random_trace(
    accounting: str, seed: int, *, blocks: int = 5, pipelines: int = 36, span: float = 30.0, quotas: dict[str, float] | None = None
) -> Trace:
    """A trace of ``blocks`` blocks arriving over the first half of ``span`` seconds and
    ``pipelines`` pipelines arriving over all of it (ids ``p000``… in arrival order). With
    ``quotas`` (team → share), every pipeline belongs to one of those teams or to a team
    ``open`` without a quota, at random."""
    rng = np.random.default_rng(seed)
    epsilon_g, delta_g = GLOBAL_BUDGET[accounting]
    block_arrival = np.sort(np.round(rng.uniform(0, span / 2, blocks) * 2) / 2)
    block_arrival[0] = 0.0
    arrival = np.sort(np.round(rng.uniform(0, span, pipelines) * 2) / 2)
    entries = []
    for i, t in enumerate(arrival.tolist()):
        existing = int(np.searchsorted(block_arrival, t, side="right"))
        count = int(rng.integers(1, min(3, existing) + 1))
        chosen = sorted(rng.choice(existing, size=count, replace=False).tolist())
        share = float(rng.choice([0.05, 0.1, 0.2, 0.35, 0.6]))
        entry = {"id": f"p{i:03d}", "arrival": t, "blocks": [f"b{j}" for j in chosen]}
        if accounting == "basic":
            entry.update(epsilon=share * epsilon_g, delta=0.0)
        else:
            entry.update(mechanism="gaussian", epsilon=share * epsilon_g, delta=1e-9)
        if rng.random() < 0.3:
            entry["timeout"] = float(rng.choice([2.0, 5.0, 12.5]))
        if quotas:
            entry["team"] = str(rng.choice([*sorted(quotas), "open"]))
        entries.append(entry)
    return Trace.model_validate(
        {
            "accounting": accounting,
            "blocks": [
                {"id": f"b{j}", "arrival": float(a), "epsilon": epsilon_g, "delta": delta_g} for j, a in enumerate(block_arrival.tolist())
            ],
            "pipelines": entries,
            **({"quotas": quotas} if quotas else {}),
        }
    )
