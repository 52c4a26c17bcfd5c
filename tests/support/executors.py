"""An executor whose jobs end the moment they start, each spending its whole grant.

It runs no process: the scheduler's tick still writes every job's context file, and the job
"spends" exactly what that file says it was granted on each block, so a settled pipeline
consumes what it was granted, as a simulated one does (docs/design.md §6.4).
"""

from __future__ import annotations

from privsched.jobs.context import JobContext
from privsched.jobs.runner import JobResult
from privsched.service.executors.base import Executor, Launch


class InstantExecutor(Executor):
    """Completes every started job at its next poll, spending the grant on every block."""

    name = "instant"

    def __init__(self) -> None:
        self._ended: list[JobResult] = []
        self.started: list[int] = []  # pipeline ids, in start order

    def start(self, launch: Launch) -> None:
        context = JobContext.from_json(launch.context.read_text())
        spent = {key: block.grant.tolist() for key, block in context.blocks.items()}
        self._ended.append(JobResult(launch.pipeline_id, True, spent=spent, touched_data=True))
        self.started.append(launch.pipeline_id)

    def poll(self, now: float) -> list[JobResult]:
        ended, self._ended = self._ended, []
        return ended

    def cancel(self, pipeline_id: int, reason: str) -> None:
        self._ended = [r if r.pipeline_id != pipeline_id else JobResult(pipeline_id, False, message=reason) for r in self._ended]

    def attach(self, launch: Launch) -> bool:
        return False

    def running(self) -> set[int]:
        return {r.pipeline_id for r in self._ended}
