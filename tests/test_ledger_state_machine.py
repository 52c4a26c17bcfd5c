"""Random sequences of every ledger operation against a small in-memory model: balances
match, the audit passes, and no block ever breaks its safety invariant (docs/design.md §3.3);
and the sequences random runs find only sometimes, as fixed examples."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from privsched.budgets.accounting import Accounting
from privsched.budgets.capacity import block_capacity
from privsched.ledger import Ledger, LedgerError, PipelineRequest
from tests.support.profiles import LEDGER_MACHINE_EXAMPLES

BUCKETS = ("locked", "unlocked", "allocated", "consumed")
fraction = st.floats(0.0, 1.0)


class LedgerMachine(RuleBasedStateMachine):
    accounting = Accounting.basic()
    epsilon, delta = 1.0, 1e-6

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.ledger = Ledger.init(Path(self.dir.name) / "ledger.db")
        self.ledger.create_dataset(
            "data", self.epsilon, self.delta, accounting=self.accounting.name, alphas=self.accounting.alphas or None, now=0
        )
        self.capacity = block_capacity(self.accounting, self.epsilon, self.delta)
        self.live = self.accounting.live(self.capacity)
        self.now = 1.0
        self.blocks: dict[str, dict[str, np.ndarray]] = {}
        self.ids: dict[str, int] = {}
        self.pipelines: dict[int, dict] = {}
        self.retired: set[str] = set()

    def teardown(self) -> None:
        self.ledger.close()
        self.dir.cleanup()

    # -- model helpers
    def in_state(self, *states: str) -> list[int]:
        return sorted(p for p, info in self.pipelines.items() if info["state"] in states)

    def shift(self, key: str, source: str, target: str, amount: np.ndarray) -> None:
        self.blocks[key][source] = self.blocks[key][source] - amount
        self.blocks[key][target] = self.blocks[key][target] + amount

    def settle(self, pid: int, used_share: float) -> None:
        for key, demand in self.pipelines[pid]["demands"].items():
            used = demand * used_share
            self.shift(key, "allocated", "consumed", used)
            self.shift(key, "allocated", "unlocked", demand - used)
            self.pipelines[pid]["consumed"][key] = used

    # -- rules
    @rule(unlocked=fraction)
    def add_block(self, unlocked):
        key = f"b{len(self.blocks)}"
        (info,) = self.ledger.add_blocks("data", [key], unlocked_fraction=unlocked, now=self.now)
        self.ids[key] = info.id
        zero = np.zeros_like(self.capacity)
        self.blocks[key] = {
            "locked": self.capacity * (1 - unlocked),
            "unlocked": self.capacity * unlocked,
            "allocated": zero,
            "consumed": zero,
        }

    @precondition(lambda self: self.blocks)
    @rule(data=st.data(), share=fraction)
    def unlock(self, data, share):
        key = data.draw(st.sampled_from(sorted(self.blocks)))
        self.ledger.unlock({self.ids[key]: share}, now=self.now)
        self.shift(key, "locked", "unlocked", np.minimum(self.blocks[key]["locked"], self.capacity * share))

    @precondition(lambda self: self.blocks)
    @rule(data=st.data(), scale=st.floats(0.0, 1.3), timeout=st.none() | st.floats(1.0, 5.0))
    def submit(self, data, scale, timeout):
        keys = data.draw(st.lists(st.sampled_from(sorted(self.blocks)), min_size=1, max_size=3, unique=True))
        shape = np.array(data.draw(st.lists(st.floats(0.2, 1.0), min_size=self.capacity.size, max_size=self.capacity.size)))
        demand = self.capacity * shape * scale
        request = PipelineRequest("p", "data", keys, demand=demand, timeout=timeout)
        charged = demand[self.live] if self.accounting.is_rdp else demand[:1]  # basic: ε > 0, δ may be 0
        if self.retired & set(keys) or not self.accounting.fits(demand, self.capacity, self.live) or not np.all(charged > 0):
            try:
                self.ledger.submit(request, now=self.now)
            except LedgerError:
                return
            raise AssertionError("a demand above capacity, free somewhere, or on a retired block, was accepted")
        pid = self.ledger.submit(request, now=self.now)
        self.pipelines[pid] = {
            "state": "pending",
            "demands": {k: demand for k in keys},
            "consumed": {},
            "deadline": None if timeout is None else self.now + timeout,
        }

    @precondition(lambda self: self.pipelines)
    @rule(data=st.data())
    def grant(self, data):
        order = data.draw(st.lists(st.sampled_from(sorted(self.pipelines)), max_size=5))
        expected = []
        for pid in order:
            info = self.pipelines[pid]
            if info["state"] != "pending":
                continue
            if all(
                k not in self.retired and self.accounting.fits(d, self.blocks[k]["unlocked"], self.live) for k, d in info["demands"].items()
            ):
                for key, demand in info["demands"].items():
                    self.shift(key, "unlocked", "allocated", demand)
                info["state"] = "granted"
                expected.append(pid)
        assert self.ledger.grant(order, now=self.now) == expected

    @precondition(lambda self: self.in_state("granted"))
    @rule(data=st.data())
    def run(self, data):
        pid = data.draw(st.sampled_from(self.in_state("granted")))
        self.ledger.mark_running(pid, {"slot": 0}, now=self.now)
        self.pipelines[pid]["state"] = "running"

    @precondition(lambda self: self.in_state("granted", "running"))
    @rule(data=st.data(), share=fraction)
    def complete(self, data, share):
        pid = data.draw(st.sampled_from(self.in_state("granted", "running")))
        demands = self.pipelines[pid]["demands"]
        self.ledger.complete(pid, {k: d * share for k, d in demands.items()}, now=self.now)
        self.settle(pid, share)
        self.pipelines[pid]["state"] = "completed"

    @precondition(lambda self: self.in_state("pending", "granted", "running"))
    @rule(data=st.data(), touched=st.booleans())
    def fail(self, data, touched):
        pid = data.draw(st.sampled_from(self.in_state("pending", "granted", "running")))
        self.ledger.fail(pid, "crashed", touched_data=touched, now=self.now)
        if self.pipelines[pid]["state"] != "pending":
            self.settle(pid, 1.0 if touched else 0.0)
        self.pipelines[pid]["state"] = "failed"

    @precondition(lambda self: self.pipelines)
    @rule(data=st.data())
    def cancel(self, data):
        pid = data.draw(st.sampled_from(sorted(self.pipelines)))
        info = self.pipelines[pid]
        if info["state"] not in ("pending", "granted"):
            try:
                self.ledger.cancel(pid, now=self.now)
            except LedgerError:
                return
            raise AssertionError(f"a {info['state']} pipeline was cancelled")
        self.ledger.cancel(pid, now=self.now)
        if info["state"] == "granted":
            self.settle(pid, 0.0)
        info["state"] = "cancelled"

    @precondition(lambda self: self.in_state("failed"))
    @rule(data=st.data())
    def release(self, data):
        pid = data.draw(st.sampled_from(self.in_state("failed")))
        spent = self.pipelines[pid]["consumed"]
        if not any(np.any(v > 0) for v in spent.values()):
            try:
                self.ledger.release(pid, "admin", now=self.now)
            except LedgerError:
                return
            raise AssertionError("a release of nothing was accepted")
        self.ledger.release(pid, "admin", now=self.now)
        for key, used in spent.items():
            self.shift(key, "consumed", "unlocked", used)
            spent[key] = np.zeros_like(used)

    @rule(step=st.floats(0.5, 3.0))
    def tick_and_expire(self, step):
        self.now += step
        due = [
            p for p in self.in_state("pending") if self.pipelines[p]["deadline"] is not None and self.pipelines[p]["deadline"] <= self.now
        ]
        assert self.ledger.expire(now=self.now) == due
        for pid in due:
            self.pipelines[pid]["state"] = "timed_out"

    @rule()
    def retire(self):
        due = [k for k, b in self.blocks.items() if k not in self.retired and np.all((self.capacity <= b["consumed"]) | ~self.live)]
        assert self.ledger.retire_exhausted(now=self.now) == sorted(self.ids[k] for k in due)
        self.retired.update(due)

    # -- invariants
    @invariant()
    def balances_match_the_model(self):
        for block in self.ledger.list_blocks("data"):
            for bucket in BUCKETS:
                # The ledger keeps balances on the exact quantum grid (10⁻¹², privsched.budgets.exact):
                # the float model differs by at most one quantum per move.
                np.testing.assert_allclose(
                    getattr(block, bucket), self.blocks[block.key][bucket], rtol=1e-9, atol=1e-10 * max(1.0, self.capacity.max())
                )

    @invariant()
    def block_states_match_the_model(self):
        retired = {b.key for b in self.ledger.list_blocks("data") if b.state == "retired"}
        assert retired == self.retired

    @invariant()
    def pipeline_states_match_the_model(self):
        states = {p.id: p.state for p in self.ledger.list_pipelines()}
        assert states == {p: info["state"] for p, info in self.pipelines.items()}

    @invariant()
    def audit_passes_and_every_block_is_safe(self):
        report = self.ledger.audit()
        assert report.ok, report.violations
        for block in self.ledger.list_blocks("data"):
            assert self.accounting.is_safe(block.allocated + block.consumed, block.capacity)


class RdpLedgerMachine(LedgerMachine):
    accounting = Accounting.rdp([1.5, 3.0, 8.0, 32.0])
    epsilon, delta = 10.0, 1e-7


machine_settings = settings(
    max_examples=LEDGER_MACHINE_EXAMPLES, stateful_step_count=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
TestBasicLedger = LedgerMachine.TestCase
TestBasicLedger.settings = machine_settings
TestRdpLedger = RdpLedgerMachine.TestCase
TestRdpLedger.settings = machine_settings


@pytest.mark.parametrize("machine", [LedgerMachine, RdpLedgerMachine], ids=["basic", "rdp"])
def test_a_grant_is_checked_against_the_unlocked_budget_not_the_capacity(tmp_db, machine):
    """A demand within the block's capacity waits while it exceeds the unlocked budget, at
    first (half unlocked) and again after a grant took part of it."""
    accounting = machine.accounting
    with Ledger.init(tmp_db) as ledger:
        ledger.create_dataset("data", machine.epsilon, machine.delta, accounting=accounting.name, alphas=accounting.alphas or None, now=0)
        (block,) = ledger.add_blocks("data", ["b0"], unlocked_fraction=0.5, now=0)
        capacity = block.capacity
        large = ledger.submit(PipelineRequest("large", "data", ["b0"], demand=capacity * 0.75), now=1)
        assert ledger.grant([large], now=1) == []  # 0.75 of capacity > 0.5 unlocked, at every order
        ledger.unlock({block.id: 0.5}, now=2)
        assert ledger.grant([large], now=2) == [large]
        second = ledger.submit(PipelineRequest("second", "data", ["b0"], demand=capacity * 0.5), now=3)
        assert ledger.grant([second], now=3) == []  # 0.25 of capacity is left unlocked
        # Within a quantum of the exact arithmetic (10⁻¹²): demands round up, capacities down.
        np.testing.assert_allclose(ledger.get_block("data", "b0").unlocked, capacity * 0.25, rtol=1e-12, atol=2e-12)
