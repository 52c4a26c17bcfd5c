"""Random sequences of submit, grant, run, complete, fail, cancel and release by members of
two teams under quotas (and by the operator, under none), against a small model: every
grant is the model's, and after every step each team holds at most its quota on every block.

Every ε is a multiple of 1/32 and every quota a power of two times the capacity, so sums are
exact in floating point and the model predicts each grant without any tolerance."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.profiles import LEDGER_MACHINE_EXAMPLES
from tests.support.teams import HOLDING, SETTLED, TEAMS, TeamLedger

BLOCKS = ["b0", "b1"]
QUOTAS = {"blue": 0.25, "red": 0.125}
SUBMITTERS = [*sorted(TEAMS), None]  # None: the operator, under no quota
epsilon = st.integers(1, 4).map(lambda k: k / 32)
spent_share = st.sampled_from([0.0, 0.5, 1.0])


class QuotaMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.teams = TeamLedger(Path(self.dir.name) / "ledger.db", BLOCKS, QUOTAS)
        self.unlocked = {b: 1.0 for b in BLOCKS}
        self.pipelines: dict[int, dict] = {}

    def teardown(self) -> None:
        self.teams.close()
        self.dir.cleanup()

    # -- the model
    def in_state(self, *states: str) -> list[int]:
        return sorted(p for p, info in self.pipelines.items() if info["state"] in states)

    def held(self, team: str) -> dict[str, float]:
        held: dict[str, float] = {}
        for info in self.pipelines.values():
            if info["team"] != team:
                continue
            amounts = info["demands"] if info["state"] in HOLDING else info["consumed"] if info["state"] in SETTLED else {}
            for key, amount in amounts.items():
                held[key] = held.get(key, 0.0) + amount
        return held

    def within_quota(self, info: dict) -> bool:
        share = QUOTAS.get(info["team"])
        if share is None:
            return True
        held = self.held(info["team"])
        return all(held.get(key, 0.0) + amount <= share for key, amount in info["demands"].items())

    def settle(self, pid: int, share: float) -> None:
        info = self.pipelines[pid]
        info["consumed"] = {key: amount * share for key, amount in info["demands"].items()}
        for key, amount in info["demands"].items():
            self.unlocked[key] += amount - amount * share

    # -- rules
    @rule(user=st.sampled_from(SUBMITTERS), blocks=st.lists(st.sampled_from(BLOCKS), min_size=1, unique=True), eps=epsilon)
    def submit(self, user, blocks, eps):
        pid = self.teams.submit(user, blocks, eps)
        team = None if user is None else TEAMS[user]
        self.pipelines[pid] = {"state": "pending", "team": team, "demands": {b: eps for b in blocks}, "consumed": {}}

    @precondition(lambda self: self.in_state("pending"))
    @rule(data=st.data())
    def grant(self, data):
        order = data.draw(st.lists(st.sampled_from(self.in_state("pending", "granted")), min_size=1, max_size=6))
        expected = []
        for pid in order:
            info = self.pipelines[pid]
            if info["state"] != "pending":
                continue
            if all(amount <= self.unlocked[key] for key, amount in info["demands"].items()) and self.within_quota(info):
                for key, amount in info["demands"].items():
                    self.unlocked[key] -= amount
                info["state"] = "granted"
                expected.append(pid)
        assert self.teams.ledger.grant(order) == expected

    @precondition(lambda self: self.in_state("granted"))
    @rule(data=st.data())
    def run(self, data):
        pid = data.draw(st.sampled_from(self.in_state("granted")))
        self.teams.ledger.mark_running(pid, {"slot": 0})
        self.pipelines[pid]["state"] = "running"

    @precondition(lambda self: self.in_state("granted", "running"))
    @rule(data=st.data(), share=spent_share)
    def complete(self, data, share):
        pid = data.draw(st.sampled_from(self.in_state("granted", "running")))
        demands = self.pipelines[pid]["demands"]
        self.teams.ledger.complete(pid, {key: [amount * share, 0.0] for key, amount in demands.items()})
        self.settle(pid, share)
        self.pipelines[pid]["state"] = "completed"

    @precondition(lambda self: self.in_state("pending", "granted", "running"))
    @rule(data=st.data(), touched=st.booleans())
    def fail(self, data, touched):
        pid = data.draw(st.sampled_from(self.in_state("pending", "granted", "running")))
        self.teams.ledger.fail(pid, "crashed", touched_data=touched)
        if self.pipelines[pid]["state"] != "pending":
            self.settle(pid, 1.0 if touched else 0.0)
        self.pipelines[pid]["state"] = "failed"

    @precondition(lambda self: self.in_state("pending", "granted"))
    @rule(data=st.data())
    def cancel(self, data):
        pid = data.draw(st.sampled_from(self.in_state("pending", "granted")))
        self.teams.ledger.cancel(pid)
        if self.pipelines[pid]["state"] == "granted":
            self.settle(pid, 0.0)
        self.pipelines[pid]["state"] = "cancelled"

    @precondition(lambda self: any(sum(self.pipelines[p]["consumed"].values()) > 0 for p in self.in_state("failed")))
    @rule(data=st.data())
    def release(self, data):
        spent = [p for p in self.in_state("failed") if sum(self.pipelines[p]["consumed"].values()) > 0]
        pid = data.draw(st.sampled_from(spent))
        self.teams.ledger.release(pid, "admin")
        for key, amount in self.pipelines[pid]["consumed"].items():
            self.unlocked[key] += amount
        self.pipelines[pid]["consumed"] = {key: 0.0 for key in self.pipelines[pid]["consumed"]}

    # -- invariants
    @invariant()
    def every_team_holds_at_most_its_quota_on_every_block(self):
        for team, share in QUOTAS.items():
            held = self.teams.held(team)
            assert all(amount <= share for amount in held.values()), f"team {team} holds {held} against a quota of {share}"

    @invariant()
    def every_team_holds_what_the_model_says(self):
        for team in QUOTAS:
            assert self.teams.held(team) == self.held(team)

    @invariant()
    def pipeline_states_match_the_model(self):
        states = {p.id: p.state for p in self.teams.ledger.list_pipelines()}
        assert states == {p: info["state"] for p, info in self.pipelines.items()}


TestQuotaMachine = QuotaMachine.TestCase
TestQuotaMachine.settings = settings(
    max_examples=LEDGER_MACHINE_EXAMPLES, stateful_step_count=30, suppress_health_check=[HealthCheck.too_slow]
)
