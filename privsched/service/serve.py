"""Serving a database: the scheduler loop, its lease, and waking up on submissions.

Exactly one scheduler serves a database at a time: :func:`serve` takes the ledger's
scheduler lease (a second one fails with :class:`ServiceError`; the lease of a holder that
died, or that was paused past its expiry, is taken over, and its jobs adopted) and renews it
while it runs. Every ledger write it makes is fenced with the lease's generation, so one
that resumes after losing its lease stops at its first write, leaving its jobs running for
its successor (which adopts them), and fails with :class:`ServiceError`. Between ticks it sleeps in short steps,
collecting finished jobs and watching SQLite's ``PRAGMA data_version`` on a connection of
its own every :data:`WATCH_INTERVAL`, so that a submission (or cancellation) from another
process is scheduled at once rather than at the next tick; a submission made in this
process (the local client, the HTTP API) wakes it directly (:mod:`privsched.service.wakeup`),
and it tells the HTTP API's waiting requests when a pass changed pipelines' states.
"""

from __future__ import annotations

import errno
import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from privsched.errors import Conflict
from privsched.ledger import Ledger
from privsched.ledger.errors import StorageFull
from privsched.ledger.lease import LeaseLost
from privsched.policies.base import PolicySpec
from privsched.service.executors.base import Executor
from privsched.service.resources import Pool
from privsched.service.rundirs import RunDirs
from privsched.service import wakeup
from privsched.service.scheduler import Scheduler, TickReport

#: How often the loop looks for commits of other processes between ticks, in seconds.
WATCH_INTERVAL = 0.002


class ServiceError(Conflict, RuntimeError):
    """The scheduler cannot serve (another one holds the database, or it lost its lease)."""


class ChangeWatcher:
    """Tells whether any other connection committed to the database since :meth:`reset`."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._seen = self._version()

    def _version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def reset(self) -> None:
        self._seen = self._version()

    def changed(self) -> bool:
        return self._version() != self._seen

    def close(self) -> None:
        self._conn.close()


@dataclass
class ServeSummary:
    ticks: int = 0
    granted: int = 0
    settled: int = 0
    pending: int = 0  # left pending when the loop stopped
    storage_full: int = 0  # ticks or polls that found the database or disk full


def _is_full(exc: BaseException) -> bool:
    """Whether an error means the database or the disk is full, or its file system read-only
    (retried, not fatal: space returns, a file system is remounted writable)."""
    return isinstance(exc, StorageFull) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
    )


class Condition:
    """What keeps the scheduler from making progress (the database or disk is full, or its
    file system read-only): logged when it starts and when it ends, and kept in the runs
    folder's ``condition`` file while it lasts (:meth:`RunDirs.condition`; best effort: the
    file may sit on the full disk), where ``privsched status``, the API and the dashboard
    read it."""

    def __init__(self, runs: RunDirs, log: Callable[[str], None]) -> None:
        self.path = runs.condition()
        self.log = log
        self.current: str | None = None
        self.path.unlink(missing_ok=True)

    def full(self, exc: BaseException) -> None:
        if self.current is None:
            what = "read-only" if getattr(exc, "errno", None) == errno.EROFS else "full"
            self.current = f"storage {what} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {exc}"
            self.log(f"{self.current}; jobs are still watched, retrying every tick")
            try:
                self.path.write_text(self.current + "\n")
            except OSError:
                pass

    def clear(self) -> None:
        if self.current is not None:
            self.current = None
            self.log("storage available again: settling resumed")
            self.path.unlink(missing_ok=True)


def serve(
    db_path: str | os.PathLike,
    policy: PolicySpec,
    executor: Executor,
    pool: Pool,
    *,
    tick: float = 1.0,
    until_idle: bool = False,
    poll_interval: float = 0.05,
    stop: threading.Event | None = None,
    log: Callable[[str], None] = lambda message: None,
    clock: Callable[[], float] = time.time,
    lease_ttl: float | None = None,
    ledger: Ledger | None = None,
    on_start: Callable[[], None] | None = None,
) -> ServeSummary:
    """Run the scheduler on a database until ``stop`` is set, or with ``until_idle`` until
    nothing runs and no pending pipeline can progress any more: nothing pending, or only
    pipelines that no budget left to unlock can satisfy and that have no timeout to reach.
    The lease lasts ``lease_ttl`` seconds past each renewal (default: 5 ticks, at least 10 s).
    ``ledger``: an open ledger of ``db_path`` to serve with (default: one opened and closed
    here). A full database or disk stops nothing: the loop keeps watching jobs, reports the
    condition (:class:`Condition`) and retries each tick until space returns. ``on_start``
    is called once the lease is held, before the first tick (what ``privsched serve``
    starts and says only once the database is its own: the API, its start-up summary)."""
    if tick <= 0 or poll_interval <= 0 or (lease_ttl is not None and not lease_ttl > 0):
        raise ValueError("tick, poll interval and lease ttl must be positive")
    stop = stop or threading.Event()
    path = Path(db_path)
    owned = ledger is None
    ledger = Ledger(path) if ledger is None else ledger
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    ttl = max(10.0, 5 * tick) if lease_ttl is None else lease_ttl
    try:
        if not ledger.acquire_lease(holder, ttl, now=clock()):
            current = ledger.lease_holder() or {}
            where = f" (pid {current.get('pid')} on {current.get('host')})" if current else ""
            raise ServiceError(f"another scheduler is already serving {path}{where}")
        try:
            if on_start is not None:
                on_start()
            loop = _Loop(ledger, path, holder, ttl, tick, until_idle, poll_interval, stop, log, clock)
            return loop.run(policy, executor, pool)
        except LeaseLost as exc:  # paused past the lease: a successor has adopted its jobs
            raise ServiceError(f"lost the scheduler lease of {path} to another scheduler ({exc})") from exc
        finally:
            ledger.release_lease(holder)
    finally:
        if owned:
            ledger.close()


@dataclass
class _Loop:
    """One scheduler serving one database: its lease, its scheduler and its pacing."""

    ledger: Ledger
    path: Path
    holder: str  # the lease holder's name
    ttl: float  # seconds the lease lasts past each renewal
    tick: float
    until_idle: bool
    poll_interval: float
    stop: threading.Event
    log: Callable[[str], None]
    clock: Callable[[], float]
    renewed: float = 0.0  # when the lease was last renewed

    def run(self, policy: PolicySpec, executor: Executor, pool: Pool) -> ServeSummary:
        """Tick until stopped (or idle), waking early on a finished job or a change."""
        runs = RunDirs(self.path)
        runs.record_pool(pool)
        runs.record_policy(policy.name, policy.params)
        scheduler = Scheduler(self.ledger, policy, executor, pool, runs, self.log)
        scheduler.recover(self.clock())
        if not self.until_idle:  # serving until stopped: jobs will come; start warm from the first
            executor.prepare()
        starts = _JobStarts(runs, executor)
        watcher = ChangeWatcher(self.path)
        woken = wakeup.listen(self.path)
        condition = Condition(runs, self.log)
        summary = ServeSummary()
        self.renewed = self.clock()
        try:
            while not self.stop.is_set():
                now = self.clock()
                report = self._tick(scheduler, condition, summary, now)
                starts.note()
                watcher.reset()
                # What committed during the tick, before the reset, is read now: another tick at once.
                fresh = report is not None and scheduler.news()
                summary.ticks += 1
                if report is not None:
                    if report.started or report.settled or report.expired:  # (the scheduler tells of grants)
                        # The API's requests waiting on these pipelines look again.
                        wakeup.changed(self.path, [*report.started, *report.settled, *report.expired])
                    summary.granted += len(report.granted)
                    summary.settled += len(report.settled)
                    summary.pending = report.pending
                    if self.until_idle and report.idle and not fresh and not (report.pending and scheduler.awaits_timeouts()):
                        break
                if not fresh:
                    self._wait(scheduler, condition, (woken, watcher), summary, now + self.tick, starts)
                    woken.clear()
        finally:
            wakeup.unlisten(self.path, woken)
            watcher.close()
            starts.clear()
        return summary

    def _tick(self, scheduler: Scheduler, condition: Condition, summary: ServeSummary, now: float) -> TickReport | None:
        """Renew the lease when a third of it has passed, and run one scheduler tick; None
        when the database or disk is full (retried next tick)."""
        try:
            if now - self.renewed > self.ttl / 3:
                if not self.ledger.renew_lease(self.holder, self.ttl, now=now):
                    raise ServiceError(f"lost the scheduler lease of {self.path} to another scheduler")
                self.renewed = now
            report = scheduler.tick(now)
        except (StorageFull, OSError) as exc:
            if not _is_full(exc):
                raise
            condition.full(exc)
            summary.storage_full += 1
            return None
        condition.clear()
        return report

    def _wait(
        self,
        scheduler: Scheduler,
        condition: Condition,
        wake: tuple[threading.Event, ChangeWatcher],
        summary: ServeSummary,
        next_tick: float,
        starts: _JobStarts,
    ) -> None:
        """Collect finished jobs until the next tick is due, a job settled, another process
        committed (a submission, a cancellation) or the loop is stopped. A submission's
        pass goes first: woken by one, it returns before settling ended jobs (each settling
        is a disk-synced write the pass would wait behind); the tick settles them after
        its pass."""
        woken, watcher = wake
        while _sleep(self.stop, None if condition.current else wake, self.poll_interval):
            if condition.current is None and (woken.is_set() or watcher.changed()):
                return
            now = self.clock()
            settled = []
            if condition.current is None:  # while storage is full, only the tick retries
                try:
                    settled = scheduler.collect(now)
                except (StorageFull, OSError) as exc:
                    if not _is_full(exc):
                        raise
                    summary.storage_full += 1
                    condition.full(exc)
            summary.settled += len(settled)
            starts.note()
            if settled:
                wakeup.changed(self.path, settled)
            if settled or now >= next_tick or (condition.current is None and (woken.is_set() or watcher.changed())):
                return


class _JobStarts:
    """Keeps the runs folder's record of how the executor starts jobs up to date (read by
    the API's ``/v1/scheduler``), written only when it changes; removed when serving ends."""

    def __init__(self, runs: RunDirs, executor: Executor) -> None:
        self.runs, self.executor = runs, executor
        self.recorded: str | None = ""  # no mode: the first note replaces a previous scheduler's record
        self.note()

    def note(self) -> None:
        mode = self.executor.start_mode()
        if mode != self.recorded:
            try:
                self.runs.record_job_starts(mode)
            except OSError:  # best effort, like the condition file: retried at the next change
                return
            self.recorded = mode

    def clear(self) -> None:
        try:
            self.runs.record_job_starts(None)
        except OSError:
            pass


def _sleep(stop: threading.Event, wake: tuple[threading.Event, ChangeWatcher] | None, seconds: float) -> bool:
    """Sleep ``seconds``, or less when ``wake`` says a submission came (woken, or another
    process committed); False once ``stop`` is set."""
    if wake is None:
        return not stop.wait(seconds)
    woken, watcher = wake
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0 or woken.wait(min(WATCH_INTERVAL, left)) or watcher.changed():
            return True
    return False


@dataclass(frozen=True)
class ServeOptions:
    """How a scheduler serves a database: the options of ``privsched serve``, of
    :meth:`privsched.client.Client.serve` and of :func:`serve_options`, named once.
    :meth:`parse` also takes durations and sizes as text (``"500ms"``, ``"2h"``, ``"64G"``)."""

    policy: str = "fcfs"  # a make_policy name: fcfs, rr-n, rr-t, dpf-n, dpf-t, dpack, dpack-n, dpack-t, optimal
    n: int | None = None  # per-arrival unlocking: each pipeline unlocks 1/N
    lifetime: float | None = None  # per-time unlocking: the data's lifetime, seconds
    k: int = 50  # DPack: grants between efficiency refreshes
    unlock: str | None = None  # overrides the policy's unlock rule: all, n or t
    tick: float = 1.0  # scheduling period, seconds
    until_idle: bool = False  # return once nothing more can happen without new submissions
    gpus: int | None = None  # GPUs jobs may use (default: detected, or the cluster's)
    cpus: float | None = None  # CPUs jobs may use (default: the machine's or the cluster's)
    memory: int | None = None  # bytes jobs may use (default: the machine's or the cluster's)
    executor: str = "local"  # where jobs run: local, or ray
    ray_address: str | None = None  # the Ray dashboard's address (default: $RAY_ADDRESS, else this machine)
    sandbox: str | None = None  # job confinement: landlock or none (default: $PRIVSCHED_SANDBOX, else landlock)
    allow_network: bool = False  # let jobs that ask for it (job.network) open TCP connections
    train_across_nodes: bool = False  # ray: data-parallel DP-SGD trains with Ray Train across nodes

    @classmethod
    def parse(cls, **options: Any) -> ServeOptions:
        """Options with ``tick`` and ``lifetime`` as seconds or durations (``"1s"``, ``"2h"``)
        and ``memory`` as bytes or a size (``"16GiB"``); ``ValueError`` with one line for a
        bad value or an unknown option."""
        from privsched.spec import parse_duration, parse_memory

        unknown = sorted(set(options) - {field.name for field in fields(cls)})
        if unknown:
            raise ValueError(f"unknown serve option {unknown[0]!r}")
        for name in ("tick", "lifetime"):
            if options.get(name) is not None:
                options[name] = parse_duration(options[name])
        if options.get("memory") is not None:
            options["memory"] = parse_memory(options["memory"])
        return cls(**options)

    def policy_spec(self) -> PolicySpec:
        """The policy and unlock rule (:func:`~privsched.policies.make_policy`)."""
        from privsched.policies import make_policy

        return make_policy(self.policy, n=self.n, lifetime=self.lifetime, k=self.k, unlock=self.unlock)

    def check(self) -> None:
        """Refuse bad options before anything starts: ``ValueError`` with one line."""
        from privsched.service.resources import make_pool

        if not self.tick > 0:
            raise ValueError(f"the tick must be a positive duration, got {self.tick!r}")
        self.policy_spec()
        make_pool(self.gpus, self.cpus, self.memory)
        if self.train_across_nodes and self.executor != "ray":
            raise ValueError("--train-across-nodes applies to the ray executor only")


def serve_with(
    db_path: str | os.PathLike,
    options: ServeOptions,
    *,
    stop: threading.Event | None = None,
    log: Callable[[str], None] | None = None,
    on_start: Callable[[Startup], None] | None = None,
) -> ServeSummary:
    """:func:`serve` with the policy, executor and pool that ``options`` name; ``on_start``
    is given the :class:`Startup` once the lease is held. Bad options raise ``ValueError``
    with one line; ``sandbox="landlock"`` (the default) where the kernel has no Landlock
    raises :class:`ServiceError`."""
    from privsched.jobs.sandbox import SandboxError, require_sandbox, sandbox_mode
    from privsched.service.executors import make_executor

    spec = options.policy_spec()
    mode = sandbox_mode(options.sandbox)
    if options.executor == "local":  # Ray workers check their own kernel when a job starts
        try:
            require_sandbox(mode)
        except SandboxError as exc:
            raise ServiceError(str(exc)) from None
    network, across = options.allow_network, options.train_across_nodes
    runner = make_executor(options.executor, options.ray_address, sandbox=mode, allow_network=network, train_across_nodes=across)
    pool = runner.pool(options.gpus, options.cpus, options.memory)
    return serve(
        db_path,
        spec,
        runner,
        pool,
        tick=options.tick,
        until_idle=options.until_idle,
        stop=stop,
        log=log or (lambda message: None),
        on_start=None if on_start is None else (lambda: on_start(Startup(Path(db_path), spec, pool, options.executor, mode))),
    )


@dataclass(frozen=True)
class Startup:
    """What a scheduler serves with, known once it holds the database's lease."""

    db: Path
    policy: PolicySpec  # its name, rule and parameters
    pool: Pool  # the compute jobs may use
    executor: str  # local or ray
    sandbox: str  # landlock or none

    def lines(self, api: str | None) -> list[str]:
        """The start-up summary ``privsched serve`` prints, with the API's address (None: no API)."""
        params = ", ".join(f"{key}={value}" for key, value in self.policy.params.items())
        gpus = ",".join(self.pool.gpus) or "none"
        nodes = f" ({len(self.pool.nodes)} nodes)" if len(self.pool.nodes) > 1 else ""
        return [
            f"serving {self.db}",
            f"  policy    {self.policy.name} ({params})",
            f"  pool      {self.pool.cpus:g} CPUs, {self.pool.memory / 2**30:.3g} GiB memory, GPUs {gpus}{nodes}",
            f"  executor  {self.executor}{', ranks across nodes' if self.pool.across_nodes else ''}, sandbox {self.sandbox}",
            f"  HTTP API  {api or 'none'}",
        ]


def serve_options(
    db_path: str | os.PathLike,
    policy: str = "fcfs",
    *,
    stop: threading.Event | None = None,
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> ServeSummary:
    """:func:`serve_with` the :class:`ServeOptions` given as keywords (``policy`` first):
    the policy by :func:`~privsched.policies.make_policy`'s names and options, as
    ``privsched simulate`` takes them, the executor by name and the pool by its sizes."""
    return serve_with(db_path, ServeOptions.parse(policy=policy, **options), stop=stop, log=log)
