"""Team quotas: the share of each block's capacity a team may hold on a dataset (after
Kueue's ClusterQueue quotas and Slurm's association limits), checked inside the ledger's
grant transaction so that no race can exceed it.

A team *holds* on a block what its pipelines were granted and not given back: the demand
of its granted and running pipelines plus what its finished ones consumed. A grant to a
team with quota share s is admitted only if ``held + demand`` fits ``s × capacity`` on
every block, in exact quanta (:mod:`privsched.budgets.exact`) and in the accounting's
sense (``Accounting.fits``: under RDP at some live order, as the ledger's own safety
invariant, Luo et al., OSDI'21 §4.2). A pipeline's team is the
one recorded when it was submitted through the API (``submissions``); pipelines without
one (local submissions, the operator's) are under no quota.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from privsched.ledger.database import Database
from privsched.budgets.accounting import Accounting
from privsched.ledger.schema import unpack

if TYPE_CHECKING:
    import numpy as np

TABLE = (
    "CREATE TABLE IF NOT EXISTS team_quotas (dataset_id INTEGER NOT NULL REFERENCES datasets(id), "
    "team TEXT NOT NULL, share REAL NOT NULL, PRIMARY KEY (dataset_id, team)) STRICT"
)


@dataclass(frozen=True)
class TeamQuotas:
    """The quotas of one dataset as its pending pipelines meet them: each pipeline's team
    (those under a quota), each team's share, and what each team holds on each block
    (block id → vector)."""

    teams: dict[int, str]
    shares: dict[str, float]
    held: dict[str, dict[int, np.ndarray]]


class QuotaCheck:
    """The quotas and holdings as seen inside one transaction; :meth:`take` admits a grant
    and counts it, so later grants of the same pass see it. Holdings are kept in exact
    quanta (:mod:`privsched.budgets.exact`)."""

    def __init__(self, db: Database, shares: dict[tuple[int, str], float]) -> None:
        self.db = db
        self.shares = shares
        self._held: dict[tuple[int, str], dict[int, np.ndarray | int]] = {}

    @classmethod
    def load(cls, db: Database) -> QuotaCheck | None:
        """The quotas of the database, or None when it has none (the common case)."""
        if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'team_quotas'").fetchone():
            return None
        shares = {(d, t): s for d, t, s in db.execute("SELECT dataset_id, team, share FROM team_quotas")}
        return cls(db, shares) if shares else None

    def team(self, pipeline_id: int) -> str | None:
        found = self.db.execute("SELECT team FROM submissions WHERE pipeline_id = ?", [pipeline_id]).fetchone()
        return found[0] if found else None

    def held(self, dataset_id: int, team: str) -> dict[int, np.ndarray | int]:
        """What the team holds on each block of the dataset (block id → quanta, rounded up)."""
        from privsched.budgets.exact import clamp, units

        key = (dataset_id, team)
        if key not in self._held:
            held: dict[int, np.ndarray | int] = defaultdict(int)  # 0 until a demand is added
            for block_id, demand, consumed, state in self.db.execute(
                "SELECT e.block_id, e.demand, e.consumed, p.state FROM demands e "
                "JOIN pipelines p ON p.id = e.pipeline_id JOIN submissions s ON s.pipeline_id = p.id "
                "WHERE p.dataset_id = ? AND s.team = ? AND p.state IN ('granted', 'running', 'completed', 'failed')",
                [dataset_id, team],
            ):
                if state in ("granted", "running"):
                    held[block_id] = clamp(held[block_id] + units(unpack(demand), up=True))
                elif consumed is not None:
                    held[block_id] = clamp(held[block_id] + units(unpack(consumed), up=True))
            self._held[key] = held
        return self._held[key]

    def of_pipelines(self, dataset_id: int, pipeline_ids: list[int]) -> TeamQuotas | None:
        """The quotas that ``pipeline_ids`` (pending pipelines of the dataset) meet, or None
        when none of them is under one."""
        import numpy as np

        from privsched.budgets.exact import value

        quoted = {team: share for (d, team), share in self.shares.items() if d == dataset_id}
        if not quoted or not pipeline_ids:
            return None
        teams = {
            pipeline_id: team
            for pipeline_id, team in self.db.execute(
                "SELECT pipeline_id, team FROM submissions WHERE pipeline_id IN (SELECT value FROM json_each(?))",
                [json.dumps(sorted(pipeline_ids))],
            )
            if team in quoted
        }
        if not teams:
            return None
        used = sorted(set(teams.values()))
        held = {team: {b: value(np.asarray(q)) for b, q in self.held(dataset_id, team).items()} for team in used}
        return TeamQuotas(teams=teams, shares={team: quoted[team] for team in used}, held=held)

    def consumed(self, dataset_id: int, team: str) -> dict[int, np.ndarray]:
        """What the team's ended pipelines consumed on each block of the dataset (block id →
        vector): the part of what it holds that never comes back."""
        found: dict[int, np.ndarray] = {}
        for block_id, consumed in self.db.execute(
            "SELECT e.block_id, e.consumed FROM demands e "
            "JOIN pipelines p ON p.id = e.pipeline_id JOIN submissions s ON s.pipeline_id = p.id "
            "WHERE p.dataset_id = ? AND s.team = ? AND p.state IN ('completed', 'failed') AND e.consumed IS NOT NULL",
            [dataset_id, team],
        ):
            found[block_id] = found[block_id] + unpack(consumed) if block_id in found else unpack(consumed)
        return found

    def refusal(
        self, pipeline_id: int, dataset_id: int, block_ids: list[int], demand: np.ndarray, capacity: np.ndarray, accounting: Accounting
    ) -> tuple[str, int] | None:
        """(team, index of the first block over quota) if granting would exceed the team's
        quota: ``held + demand ≤ share × capacity`` in exact quanta, the share's part of the
        capacity rounded down (:func:`~privsched.budgets.exact.share_of`)."""
        import numpy as np

        from privsched.budgets.exact import clamp, share_of, units

        team = self.team(pipeline_id)
        if team is None:
            return None
        share = self.shares.get((dataset_id, team))
        if share is None:
            return None
        held = self.held(dataset_id, team)
        after = clamp(np.stack([held[b] + units(d, up=True) for b, d in zip(block_ids, demand)]))
        fits = accounting.fits_units(after, share_of(share, capacity), accounting.live(capacity))
        return None if np.all(fits) else (team, int(np.argmin(fits)))

    def take(
        self, pipeline_id: int, dataset_id: int, block_ids: list[int], demand: np.ndarray, capacity: np.ndarray, accounting: Accounting
    ) -> bool:
        """Admit a grant within its team's quota and count it as held; False if over."""
        from privsched.budgets.exact import clamp, units

        if self.refusal(pipeline_id, dataset_id, block_ids, demand, capacity, accounting) is not None:
            return False
        team = self.team(pipeline_id)
        if team is not None and (dataset_id, team) in self.shares:
            held = self.held(dataset_id, team)
            for block_id, amount in zip(block_ids, demand):
                held[block_id] = clamp(held[block_id] + units(amount, up=True))
        return True
