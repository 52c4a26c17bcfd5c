"""Submissions are scheduled at once: the scheduler sees what committed while it ticked,
placing jobs yields to new arrivals, and a submission in the same process wakes the loop."""

from __future__ import annotations

from pathlib import Path

from privsched.ledger import Ledger, PipelineRequest
from privsched.policies import make_policy
from privsched.service import wakeup
from privsched.service.executors.base import Launch
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service.scheduler import Scheduler
from tests.support.executors import InstantExecutor


def setup(path: Path, executor: InstantExecutor) -> Scheduler:
    ledger = Ledger.init(path)
    ledger.create_dataset("d", 1.0, 1e-6, accounting="basic", now=0.0)
    ledger.add_blocks("d", ["b0", "b1", "b2"], unlocked_fraction=1.0, now=0.0)
    scheduler = Scheduler(ledger, make_policy("fcfs"), executor, Pool((), cpus=8.0, memory=0), RunDirs(path))
    scheduler.recover(0.0)
    return scheduler


def request(block: str) -> PipelineRequest:
    return PipelineRequest(name="p", dataset="d", block_keys=[block], demand=[0.1, 1e-8], job={"function": "x:y"})


def test_a_submission_committed_after_a_tick_is_news_until_a_pass_sees_it(tmp_db: Path) -> None:
    scheduler = setup(tmp_db, InstantExecutor())
    scheduler.tick(1.0)
    assert not scheduler.news()
    with Ledger(tmp_db) as other:
        pipeline_id = other.submit(request("b0"), now=1.5)
    assert scheduler.news()
    assert scheduler.tick(2.0).granted == [pipeline_id]
    assert not scheduler.news()
    scheduler.ledger.close()


class SubmittingExecutor(InstantExecutor):
    """Starts jobs instantly; the first start submits another pipeline, as a user would meanwhile."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.submitted: list[int] = []

    def start(self, launch: Launch) -> None:
        super().start(launch)
        if not self.submitted:
            with Ledger(self.path) as other:
                self.submitted.append(other.submit(request("b2"), now=1.0))


def test_placing_jobs_stops_for_a_pipeline_that_arrived_and_its_pass_comes_first(tmp_db: Path) -> None:
    executor = SubmittingExecutor(tmp_db)
    scheduler = setup(tmp_db, executor)
    first = [scheduler.ledger.submit(request(block), now=0.5) for block in ("b0", "b1")]
    report = scheduler.tick(1.0)
    assert report.granted == first and report.started == first[:1] and report.waiting == 1
    assert scheduler.news()
    report = scheduler.tick(1.0)
    assert report.granted == executor.submitted and report.started == [first[1], *executor.submitted]
    scheduler.ledger.close()


def test_a_notification_wakes_the_listeners_of_that_database_only(tmp_path: Path) -> None:
    mine, other = wakeup.listen(tmp_path / "a.db"), wakeup.listen(tmp_path / "b.db")
    try:
        wakeup.notify(tmp_path / "." / "a.db")
        assert mine.is_set() and not other.is_set()
    finally:
        wakeup.unlisten(tmp_path / "a.db", mine)
        wakeup.unlisten(tmp_path / "b.db", other)
