"""A scheduler that reads only the ledger's changes and shows a per-pipeline-order policy
only the pipelines that changed grants, times out and ends the same pipelines at the same
ticks as one that reads everything and shows the policy every pending pipeline."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privsched.ledger import Ledger, PipelineRequest
from privsched.policies import make_policy
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service.scheduler import Scheduler
from tests.support.executors import InstantExecutor

POLICIES = {"fcfs": {}, "dpf-n": {"n": 3}, "dpf-t": {"lifetime": 10.0}, "dpack": {"n": 3}}

operation = st.one_of(
    st.tuples(st.just("blocks"), st.integers(1, 2)),
    st.tuples(
        st.just("submit"),
        st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True),
        st.sampled_from([0.1, 0.25, 0.4, 0.7]),
        st.sampled_from([None, 2.0, 6.0]),
    ),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 1.0, 4.0])),
)


def scheduler(path: Path, policy: str, accounting: str) -> Scheduler:
    ledger = Ledger.init(path)
    ledger.create_dataset("d", 1.0, 1e-6, accounting=accounting, now=0.0)
    ledger.add_blocks("d", ["b0", "b1"], now=0.0)
    return Scheduler(ledger, make_policy(policy, **POLICIES[policy]), InstantExecutor(), Pool((), cpus=1e6, memory=0), RunDirs(path))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    accounting=st.sampled_from(["basic", "rdp"]),
    operations=st.lists(operation, min_size=1, max_size=25),
)
def test_reading_changes_decides_as_reading_everything(policy: str, accounting: str, operations: list) -> None:
    with tempfile.TemporaryDirectory() as folder:
        kept, fresh = (scheduler(Path(folder) / f"{name}.db", policy, accounting) for name in ("kept", "fresh"))
        blocks, now = 2, 0.0
        for operation in [*operations, ("tick", 4.0), ("tick", 4.0), ("tick", 4.0)]:
            kind = operation[0]
            for sched in (kept, fresh):
                ledger = sched.ledger
                if kind == "blocks":
                    ledger.add_blocks("d", [f"b{blocks + i}" for i in range(operation[1])], now=now)
                elif kind == "submit":
                    keys = sorted({f"b{i % blocks}" for i in operation[1]})
                    capacity = ledger.get_dataset("d").capacity
                    ledger.submit(
                        PipelineRequest(name="p", dataset="d", block_keys=keys, demand=capacity * operation[2], timeout=operation[3]),
                        now=now,
                    )
                elif kind == "cancel":
                    pending = [p.id for p in ledger.list_pipelines(states=["pending"])]
                    if pending:
                        ledger.cancel(pending[operation[1] % len(pending)], now=now)
            if kind == "blocks":
                blocks += operation[1]
            if kind == "tick":
                now += operation[1]
                fresh.pending.rebuild()
                mine, truth = kept.tick(now), fresh.tick(now)
                assert (mine.granted, mine.expired, mine.pending) == (truth.granted, truth.expired, truth.pending)
        states = [[(p.id, p.state, p.granted_at) for p in s.ledger.list_pipelines()] for s in (kept, fresh)]
        assert states[0] == states[1]
        for name in ("unlocked", "consumed"):
            assert all(
                np.array_equal(getattr(a, name), getattr(b, name)) for a, b in zip(kept.ledger.list_blocks(), fresh.ledger.list_blocks())
            )
        kept.ledger.close()
        fresh.ledger.close()
