"""A ledger shared by teams under quotas, driven without a server: users of teams ``blue``
and ``red`` (and the operator, under no quota) submit to dataset ``stats`` (basic
accounting, ε_G = 1, every block fully unlocked), as the HTTP API records them
(``Identities.claim`` inside the submit transaction).

What a team *holds* is recomputed here from the ledger's public reads, independently of
the code under test: the demand of its granted and running pipelines plus what its
completed and failed ones consumed (docs/design.md §4.4, ``privsched/ledger/quotas.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privsched.ledger import Ledger, PipelineRequest
from privsched.ledger.identities import Identities, User

TEAMS = {"ann": "blue", "bea": "blue", "rex": "red"}
HOLDING = ("granted", "running")
SETTLED = ("completed", "failed")


class TeamLedger:
    """A real ledger file with users of two teams and quotas on dataset ``stats``."""

    def __init__(self, path: Path, blocks: list[str], quotas: dict[str, float]) -> None:
        self.ledger = Ledger.init(path)
        self.ledger.create_dataset("stats", 1.0, 1e-6, accounting="basic", now=0)
        self.ledger.add_blocks("stats", blocks, unlocked_fraction=1.0, now=0)
        dataset_id = self.ledger.get_dataset("stats").id
        with Identities(path) as identities:
            for name, team in TEAMS.items():
                identities.add_user(name, "submitter", team)
            for team, share in quotas.items():
                identities.set_quota(dataset_id, team, share)
            self.users: dict[str, User] = {u.name: u for u in identities.users()}
        self.quotas = dict(quotas)

    def close(self) -> None:
        self.ledger.close()

    def submit(self, user: str | None, blocks: list[str], epsilon: float) -> int:
        """A pending pipeline asking ``epsilon`` (δ = 0) on each block, submitted by ``user``
        for their team, or by the operator (``None``) for no team."""
        request = PipelineRequest("p", "stats", blocks, demand=np.array([epsilon, 0.0]), owner=user or "")
        if user is None:
            return self.ledger.submit(request)
        claim = Identities.claim(self.ledger.db, [(self.users[user], None)])
        (pipeline_id,) = self.ledger.submit_many([request], claim=claim, actor=user)
        return pipeline_id

    def held(self, team: str) -> dict[str, float]:
        """ε the team holds on each block, from the pipelines' states, demands and consumption."""
        held: dict[str, float] = {}
        for p in self.ledger.list_pipelines(dataset="stats"):
            if TEAMS.get(p.owner) != team:
                continue
            if p.state in HOLDING:
                amounts = p.demands
            elif p.state in SETTLED and p.consumed is not None:
                amounts = p.consumed
            else:
                continue
            for key, amount in amounts.items():
                held[key] = held.get(key, 0.0) + float(amount[0])
        return held
