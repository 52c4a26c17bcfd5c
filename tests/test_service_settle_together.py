"""The scheduler settles jobs that ended together in one ledger transaction
(:meth:`privsched.ledger.Ledger.settle_many`): one disk sync for all of them."""

from __future__ import annotations

from pathlib import Path

from privsched.jobs.runner import JobResult
from tests.support.executors import InstantExecutor
from tests.test_service_wakeup import request, setup


class EndsAtSecondPoll(InstantExecutor):
    """Its jobs end together, reported at its second poll."""

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def poll(self, now: float) -> list[JobResult]:
        self.polls += 1
        return [] if self.polls == 1 else super().poll(now)


def test_jobs_that_ended_together_are_settled_in_one_commit(tmp_db: Path) -> None:
    scheduler = setup(tmp_db, EndsAtSecondPoll())
    ids = [scheduler.ledger.submit(request(block), now=0.5) for block in ("b0", "b1", "b2")]
    assert scheduler.tick(1.0).started == ids
    statements: list[str] = []
    scheduler.ledger.db.conn.set_trace_callback(statements.append)
    assert sorted(scheduler.collect(1.5)) == ids
    scheduler.ledger.db.conn.set_trace_callback(None)
    assert statements.count("COMMIT") == 1
    assert [p.state for p in scheduler.ledger.list_pipelines()] == ["completed"] * 3
    assert scheduler.ledger.audit().ok
    scheduler.ledger.close()
