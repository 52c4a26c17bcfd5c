"""The scheduler's in-memory pending set (privsched.service.pending) equals a fresh read of
the ledger after any sequence of operations, made through its own connection, another
connection or another process."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from privsched.ledger import Ledger, LedgerError, PendingView, PipelineRequest
from privsched.service.pending import PendingSet
from privsched.service.snapshot import snapshot_of

REPO = Path(__file__).resolve().parents[1]
DATASETS = {"stats": "basic", "reviews": "rdp"}


def assert_same(kept: PendingSet, fresh: PendingSet) -> None:
    """Two pending sets hold the same datasets, blocks, arrivals and pending pipelines."""
    assert kept.head == fresh.head
    assert kept.datasets.keys() == fresh.datasets.keys()
    assert kept.blocks.keys() == fresh.blocks.keys()
    for block_id, block in fresh.blocks.items():
        mine = kept.blocks[block_id]
        assert mine.state == block.state
        for bucket in ("capacity", "locked", "unlocked", "allocated", "consumed"):
            assert np.array_equal(getattr(mine, bucket), getattr(block, bucket)), (block_id, bucket)
    assert +kept.arrivals == +fresh.arrivals
    for dataset_id in fresh.datasets:
        assert_same_view(kept.view(dataset_id), fresh.view(dataset_id), dataset_id)


def assert_matches_ledger(kept: PendingSet, ledger: Ledger) -> None:
    """The pending set's views are the ledger's own pending views."""
    for dataset_id, info in kept.datasets.items():
        assert_same_view(kept.view(dataset_id), ledger.pending_view(info.name), info.name)


def assert_same_view(mine: PendingView, truth: PendingView, label: object) -> None:
    """Two views hold the same blocks and pending pipelines, and give the same policy snapshot."""
    for name in ("block_ids", "capacity", "unlocked"):
        assert np.array_equal(getattr(mine, name), getattr(truth, name)), (label, name)
    for name in ("pipeline_ids", "arrival", "weight", "deadline", "edge_pipeline", "edge_block", "edge_demand"):
        assert np.array_equal(getattr(mine.pipelines, name), getattr(truth.pipelines, name)), (label, name)
    ours, theirs = snapshot_of(mine), snapshot_of(truth)
    for name in ("capacity", "unlocked", "pipeline_ids", "arrival", "weight", "edge_pipeline", "edge_block", "edge_demand"):
        assert np.array_equal(getattr(ours, name), getattr(theirs, name)), (label, name)


class PendingMachine(RuleBasedStateMachine):
    """Every ledger operation, through the scheduler's connection or a second one."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        path = Path(self.dir.name) / "ledger.db"
        self.ledger = Ledger.init(path)
        self.other = Ledger(path)
        for name, accounting in DATASETS.items():
            self.ledger.create_dataset(name, 1.0, 1e-6, accounting=accounting)
        self.pending = PendingSet(self.ledger)
        self.pending.refresh()
        self.keys: dict[str, list[str]] = {name: [] for name in DATASETS}

    def teardown(self) -> None:
        self.other.close()
        self.ledger.close()
        self.dir.cleanup()

    def by(self, other: bool) -> Ledger:
        return self.other if other else self.ledger

    def ids(self, *states: str) -> list[int]:
        return [p.id for p in self.ledger.list_pipelines(states=list(states))]

    @rule(
        dataset=st.sampled_from(sorted(DATASETS)), count=st.integers(1, 3), unlocked=st.sampled_from([0.0, 0.5, 1.0]), other=st.booleans()
    )
    def add_blocks(self, dataset: str, count: int, unlocked: float, other: bool) -> None:
        keys = [f"b{len(self.keys[dataset]) + i}" for i in range(count)]
        self.by(other).add_blocks(dataset, keys, unlocked_fraction=unlocked)
        self.keys[dataset] += keys

    @rule(dataset=st.sampled_from(sorted(DATASETS)), data=st.data(), share=st.sampled_from([0.05, 0.3, 0.9]), other=st.booleans())
    def submit(self, dataset: str, data: st.DataObject, share: float, other: bool) -> None:
        if not self.keys[dataset]:
            return
        keys = data.draw(st.lists(st.sampled_from(self.keys[dataset]), min_size=1, max_size=3, unique=True))
        info = self.ledger.get_dataset(dataset)
        try:
            self.by(other).submit(PipelineRequest(name="p", dataset=dataset, block_keys=keys, demand=info.capacity * share))
        except LedgerError:  # a retired block
            pass

    @rule(fraction=st.sampled_from([0.1, 0.5, 1.0]), other=st.booleans())
    def unlock(self, fraction: float, other: bool) -> None:
        blocks = [b.id for b in self.ledger.list_blocks(active_only=True)]
        if blocks:
            self.by(other).unlock({b: fraction for b in blocks})

    @rule(other=st.booleans())
    def grant(self, other: bool) -> None:
        self.by(other).grant(self.ids("pending"))

    @rule(data=st.data(), other=st.booleans())
    def cancel(self, data: st.DataObject, other: bool) -> None:
        candidates = self.ids("pending", "granted")
        if candidates:
            self.by(other).cancel(data.draw(st.sampled_from(candidates)))

    @rule(data=st.data(), spent=st.sampled_from([0.0, 0.5, 1.0]), other=st.booleans())
    def complete(self, data: st.DataObject, spent: float, other: bool) -> None:
        candidates = self.ledger.list_pipelines(states=["granted"])
        if candidates:
            info = data.draw(st.sampled_from(candidates))
            self.by(other).complete(info.id, {k: d * spent for k, d in info.demands.items()})
            self.by(other).retire_exhausted()

    @rule(data=st.data(), touched=st.booleans(), other=st.booleans())
    def fail(self, data: st.DataObject, touched: bool, other: bool) -> None:
        candidates = self.ids("pending", "granted")
        if candidates:
            self.by(other).fail(data.draw(st.sampled_from(candidates)), "failed", touched_data=touched)

    @rule(data=st.data(), other=st.booleans())
    def release(self, data: st.DataObject, other: bool) -> None:
        candidates = [
            p.id for p in self.ledger.list_pipelines(states=["failed"]) if p.consumed and any(np.any(c > 0) for c in p.consumed.values())
        ]
        if candidates:
            self.by(other).release(data.draw(st.sampled_from(candidates)), "refund")

    @rule()
    def refresh(self) -> None:
        self.pending.refresh()

    @invariant()
    def equals_a_fresh_read(self) -> None:
        self.pending.refresh()
        fresh = PendingSet(self.other)
        fresh.refresh()
        assert_same(self.pending, fresh)
        assert_matches_ledger(self.pending, self.ledger)


TestPendingMachine = PendingMachine.TestCase
TestPendingMachine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_changes_made_by_another_process_are_read(tmp_db: Path) -> None:
    ledger = Ledger.init(tmp_db)
    ledger.create_dataset("reviews", 1.0, 1e-6, accounting="rdp")
    ledger.add_blocks("reviews", ["b0", "b1"], unlocked_fraction=0.5)
    pending = PendingSet(ledger)
    pending.refresh()
    script = textwrap.dedent("""
        import sys
        from privsched.ledger import Ledger, PipelineRequest
        ledger = Ledger(sys.argv[1])
        capacity = ledger.get_dataset("reviews").capacity
        ledger.add_blocks("reviews", ["b2"], unlocked_fraction=1.0)
        ids = [ledger.submit(PipelineRequest(name=f"p{i}", dataset="reviews", block_keys=keys,
                                             demand=capacity * 0.2))
               for i, keys in enumerate([["b0"], ["b1", "b2"], ["b2"]])]
        ledger.grant(ids[1:])
        ledger.cancel(ids[2])
        ledger.unlock({1: 1.0})
    """)
    subprocess.run([sys.executable, "-c", script, str(tmp_db)], check=True, cwd=REPO)
    marks = pending.refresh()
    fresh = PendingSet(ledger)
    fresh.refresh()
    assert_same(pending, fresh)
    assert_matches_ledger(pending, ledger)
    assert not marks.everything
    assert pending.count == 1 and +pending.arrivals == {1: 1, 2: 1, 3: 2}
    ledger.close()


def test_a_gap_in_the_event_log_reads_everything_again(tmp_db: Path) -> None:
    ledger = Ledger.init(tmp_db)
    ledger.create_dataset("reviews", 1.0, 1e-6, accounting="basic")
    ledger.add_blocks("reviews", ["b0"])
    pending = PendingSet(ledger)
    pending.refresh()
    pending.head = pending.head + 5  # as if the log had been rewritten below what was read
    ledger.add_blocks("reviews", ["b1"])
    assert pending.refresh().everything
    assert len(pending.blocks) == 2
    ledger.close()


@pytest.mark.parametrize("since", [None, 0])
def test_a_new_ledger_has_no_changes(tmp_db: Path, since: int | None) -> None:
    ledger = Ledger.init(tmp_db)
    changes = ledger.changes(since)
    assert changes is not None and changes.head == 0 and not changes.blocks and not changes.pending
    ledger.close()
