"""The executor interface: how the scheduler starts, watches and stops granted jobs.

An executor runs each job as ``python -m privsched.jobs.runner CONTEXT RESULT`` somewhere
(a local process, a Ray task, ...) with its placement's GPUs visible, under the
:attr:`Executor.sandbox` the operator chose (the runner confines the job itself), and reports how each
job ended as a :class:`~privsched.jobs.runner.JobResult`. It never touches the ledger: the
scheduler settles every result there. Five operations:

- :meth:`Executor.start` a job described by a :class:`Launch`;
- :meth:`Executor.poll` for jobs that ended since the last poll (never blocks);
- :meth:`Executor.cancel` a job (it ends as failed, reported by a later poll);
- :meth:`Executor.attach` to a job started by an earlier scheduler process, after a restart
  (found by its launch token when its process id was never recorded);
- :meth:`Executor.running` ids it is watching. Logs are files (:class:`Launch.log`).

A job that exits without writing its result is reported failed with ``touched_data=True``
(conservative: docs/design.md §4.4); so is one stopped (cancelled, past its ``max_runtime``)
unless its supervisor, stopped by ``SIGTERM``, wrote that the job had not reached its data.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from privsched.jobs.runner import JobResult
from privsched.service.resources import Placement, Pool, make_pool

#: The environment variable that carries a job process's launch token.
LAUNCH_TOKEN_ENV = "PRIVSCHED_LAUNCH_TOKEN"
#: Variables no job may see: the operator's Ray token and the file that holds it.
SECRET_VARIABLES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def without_secrets(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without :data:`SECRET_VARIABLES`."""
    return {name: value for name, value in environment.items() if name not in SECRET_VARIABLES}


@dataclass(frozen=True)
class Launch:
    """Everything an executor needs to run one granted job."""

    pipeline_id: int
    context: Path  # the runner's context file
    result: Path  # where the runner writes its JobResult
    log: Path  # the job's stdout and stderr
    placement: Placement
    started_at: float
    max_runtime: float | None = None
    token: str | None = None  # the launch token, in the job's environment as LAUNCH_TOKEN_ENV

    @property
    def deadline(self) -> float | None:
        return None if self.max_runtime is None else self.started_at + self.max_runtime


def read_result(launch: Launch, exit_note: str) -> JobResult:
    """The job's result file, or a conservative failure when it has none (``exit_note`` says
    how the process ended)."""
    try:
        result = JobResult.from_json(launch.result.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return JobResult(launch.pipeline_id, False, message=f"job {exit_note} without writing its result")
    if result.pipeline_id != launch.pipeline_id:
        return JobResult(launch.pipeline_id, False, message="job wrote the result of another pipeline")
    return result


def failure(launch: Launch, message: str, sent: JobResult | None = None) -> JobResult:
    """A job stopped from outside (timeout, cancel): failed with ``message``; its data
    untouched only when its supervisor's result says so (its supervisor saw every data
    access): ``sent`` through the result pipe, else its result file; else assumed touched."""
    try:
        written = sent if sent is not None else JobResult.from_json(launch.result.read_text())
        touched = written.pipeline_id != launch.pipeline_id or written.touched_data
    except (OSError, ValueError, KeyError, TypeError):
        touched = True
    return JobResult(launch.pipeline_id, False, touched_data=touched, message=message)


class Executor(ABC):
    """Runs granted jobs; see the module docstring for the contract."""

    name: str
    #: How jobs are confined: ``landlock`` or ``none`` (:mod:`privsched.jobs.sandbox`).
    sandbox: str = "landlock"
    #: Whether the operator lets jobs that ask for it keep TCP access.
    allow_network: bool = False

    @abstractmethod
    def start(self, launch: Launch) -> None:
        """Start a job; raise ``OSError`` if it cannot be started at all."""

    @abstractmethod
    def poll(self, now: float) -> list[JobResult]:
        """Results of jobs that ended since the last call; kills jobs past their deadline."""

    @abstractmethod
    def cancel(self, pipeline_id: int, reason: str) -> None:
        """Stop a running job; its failure (with ``reason``) comes from a later poll."""

    @abstractmethod
    def attach(self, launch: Launch) -> bool:
        """Watch a job started before a scheduler restart; whether it is still running. A job
        that is gone is reported by the next poll from its result file, or failed if it has none."""

    @abstractmethod
    def running(self) -> set[int]:
        """Ids of the jobs being watched."""

    def prepare(self) -> None:  # noqa: B027 -- most executors have nothing to prepare
        """Get ready to start jobs (a serving scheduler calls it once, when it starts)."""

    def start_mode(self) -> str | None:
        """How the next job would start, where the executor has more than one way: "warm",
        or "cold: " and why; None where it has one way only."""
        return None

    def process(self, pipeline_id: int) -> tuple[int, str | None] | None:
        """A watched job's process id and start time, where the executor knows them."""
        return None

    def pool(self, gpus: int | None = None, cpus: float | None = None, memory: int | None = None) -> Pool:
        """The compute this executor runs jobs on, with any of its sizes overridden (default:
        this machine's, see :func:`~privsched.service.resources.make_pool`)."""
        return make_pool(gpus, cpus, memory)
