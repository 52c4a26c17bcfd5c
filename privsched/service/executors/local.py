"""The local executor: each job in its own process on this machine.

The job runs its supervisor (:mod:`privsched.jobs.runner`, which confines the job and ends
every process it leaves) in a new session (so it survives a scheduler crash and can be
killed as a whole process group), with ``CUDA_VISIBLE_DEVICES`` set to its placement's GPUs
(empty when it has none) and thread pools sized to its CPUs. The supervisor is forked from a
warm fork server (:mod:`privsched.service.executors.warm_launcher`), which has the runner,
torch and Opacus imported already; while the fork server is starting, or when it died or
does not answer, the job starts cold instead, as ``python -m privsched.jobs.runner``.
Its stdout and stderr go to its log file, cut to its tail at every poll once it grows past
its limit (:mod:`privsched.service.logcap`). A job past its ``max_runtime`` or cancelled gets
SIGTERM (on which the supervisor kills the job's every process), then SIGKILL after a grace
period. The process id and start time are written next to the job (out of its reach), so
that a restarted scheduler can watch the jobs an earlier one started; a job whose pid file
was never written is found by the launch token in its supervisor's environment (the job's
own processes do not carry it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from privsched.jobs.runner import JOB_VARIABLES, JobResult, write_atomic
from privsched.ledger.lease import pid_exists
from privsched.service.executors.base import LAUNCH_TOKEN_ENV, Executor, Launch, failure, read_result
from privsched.service.executors.result_pipe import ResultPipe
from privsched.service.executors.warm_launcher import ForkServer, WarmLauncher
from privsched.service.logcap import cap_log


def _start_ticks(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), to tell it from a later reuse of its
    pid, or None when it no longer exists (or is a zombie). Linux /proc only; elsewhere
    the pid alone is trusted."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return "unknown"
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def find_by_token(token: str) -> int | None:
    """The process (the session leader, when several) whose environment carries this launch
    token, among the processes of this user visible in /proc; None when there is none."""
    wanted = f"{LAUNCH_TOKEN_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    for pid in found:
        try:
            if os.getsid(pid) == pid and _start_ticks(pid) is not None:
                return pid
        except OSError:
            continue
    return next((pid for pid in found if _start_ticks(pid) is not None), None)


def _threads(launch: Launch) -> int:
    """The threads a job's pools get: its CPUs, at least one."""
    return max(1, int(launch.placement.cpus))


def _alive(pid: int, ticks: str | None) -> bool:
    if not Path("/proc").is_dir():
        return pid_exists(pid)
    now = _start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


@dataclass
class _Job:
    launch: Launch
    pid: int
    ticks: str | None
    process: subprocess.Popen | None  # None for a job forked by a fork server or attached after a restart
    server: ForkServer | None = None  # the fork server it was forked from
    pipe: ResultPipe | None = None  # None for a job attached after a restart
    sent_at: float | None = None  # when its result arrived through the result pipe
    stop_reason: str | None = None
    stopped_at: float = 0.0

    def sent_result(self) -> JobResult | None:
        """The result its supervisor sent through the result pipe, once complete."""
        return None if self.pipe is None else self.pipe.result(self.launch.pipeline_id)

    def exit_note(self) -> str | None:
        """None while running, else how it ended."""
        if self.process is not None:
            code = self.process.poll()
            return None if code is None else f"exited with code {code}"
        if self.server is not None and not self.server.dead:
            code = self.server.exit_code(self.pid)
            if code is not None:
                return f"exited with code {code}" if code >= 0 else f"killed by signal {-code}"
            if not self.server.dead:
                return None  # running, or just ended and about to be reported by its fork server
        return None if _alive(self.pid, self.ticks) else "ended"


#: Seconds a supervisor that sent its result through the result pipe has to exit before it
#: counts as waiting for room on a full disk, and its job as ended with that result.
RESULT_FILE_GRACE = 1.0


def _ending(job: _Job, note: str | None, sent: JobResult | None) -> JobResult:
    """How a job ended: stopped from outside; else its result file; else what its supervisor
    sent through the result pipe, which arrives first when the result file cannot be written
    (its supervisor then keeps retrying the file while the disk is full: ``note`` is None)."""
    if job.stop_reason:
        return failure(job.launch, job.stop_reason, sent)
    if note is None or (sent is not None and not job.launch.result.exists()):
        assert sent is not None
        return sent
    return read_result(job.launch, note)


class LocalExecutor(Executor):
    """Runs each job as a process of its own, forked from a warm fork server or started cold."""

    name = "local"

    def __init__(self, python: str = sys.executable, grace: float = 3.0, *, warm: bool = True) -> None:
        """``warm``: fork jobs from a fork server (started by :meth:`prepare`, or else by the
        first launch; Linux only), else start every job cold."""
        self.python = python
        self.grace = grace
        self._jobs: dict[int, _Job] = {}
        warm = warm and sys.platform.startswith("linux")
        self.launcher = WarmLauncher(python, self._base_environment) if warm else None

    def prepare(self) -> None:
        """Start the fork server now, so that jobs start warm once it has imported its
        modules (a few seconds), not only after the first job has started cold."""
        if self.launcher is not None:
            self.launcher.maintain()

    def start_mode(self) -> str | None:
        if self.launcher is None:
            return None
        server = self.launcher.server
        if server is not None and server.ready and not server.dead:
            return "warm"
        if self.launcher.failure is not None:
            return f"cold: the fork server could not start ({self.launcher.failure})"
        if not self.launcher.started:
            return "cold: the fork server starts with the first job"
        return "cold: the fork server is starting"

    @staticmethod
    def _base_environment() -> dict[str, str]:
        """A supervisor's environment, built from the jobs' allow-list (:data:`JOB_VARIABLES`
        and ``LC_*``), never inherited whole (the operator's tokens and cloud keys stay with
        the scheduler), with privsched importable and no launch token."""
        env = {name: value for name, value in os.environ.items() if name in JOB_VARIABLES or name.startswith("LC_")}
        package_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        return env

    def _environment(self, launch: Launch) -> dict[str, str]:
        env = self._base_environment()
        env["CUDA_VISIBLE_DEVICES"] = ",".join(launch.placement.gpus)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(_threads(launch))
        if launch.token is not None:
            env[LAUNCH_TOKEN_ENV] = launch.token
        return env

    def start(self, launch: Launch) -> None:
        launch.result.unlink(missing_ok=True)
        argv = [str(launch.context), str(launch.result), "--sandbox", self.sandbox]
        argv += ["--network"] if self.allow_network else []
        env, cwd = self._environment(launch), launch.context.parent
        pipe = ResultPipe()
        try:
            with open(os.open(launch.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
                spec = {"argv": argv, "env": env, "cwd": str(cwd), "threads": _threads(launch)}
                forked = None if self.launcher is None else self.launcher.launch(spec, log.fileno(), pipe.write_fd)
                process = None
                if forked is None:
                    process = subprocess.Popen(
                        [self.python, "-m", "privsched.jobs.runner", *argv, "--result-fd", str(pipe.write_fd)],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=cwd,
                        env=env,
                        start_new_session=True,
                        pass_fds=(pipe.write_fd,),
                    )
        except BaseException:
            pipe.close()
            raise
        pipe.handed_over()
        server, pid = (None, process.pid) if process is not None else forked  # type: ignore[misc]
        ticks = _start_ticks(pid)
        write_atomic(launch.context.parent / "pid", f"{pid} {ticks or ''}\n")
        self._jobs[launch.pipeline_id] = _Job(launch, pid, ticks, process, server, pipe)

    def attach(self, launch: Launch) -> bool:
        pid_file = launch.context.parent / "pid"
        try:
            pid_text, *rest = pid_file.read_text().split()
            pid, ticks = int(pid_text), (rest[0] if rest else None)
        except (OSError, ValueError):
            pid, ticks = -1, None
            found = None if launch.token is None else find_by_token(launch.token)
            if found is not None:
                pid, ticks = found, _start_ticks(found)
                pid_file.write_text(f"{pid} {ticks or ''}\n")
        job = _Job(launch, pid, ticks, None)
        self._jobs[launch.pipeline_id] = job
        return pid > 0 and job.exit_note() is None

    def _signal(self, job: _Job, sig: int) -> None:
        if job.pid > 0 and (job.process is not None or _alive(job.pid, job.ticks)):
            try:
                os.killpg(job.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop(self, job: _Job, reason: str, now: float) -> None:
        if job.stop_reason is None:
            job.stop_reason, job.stopped_at = reason, now
            self._signal(job, signal.SIGTERM)

    def cancel(self, pipeline_id: int, reason: str) -> None:
        job = self._jobs.get(pipeline_id)
        if job is not None:
            self._stop(job, reason, time.time())

    def poll(self, now: float) -> list[JobResult]:
        if self.launcher is not None:
            self.launcher.revive()  # replace a fork server that died, so the next launch is warm
        results = []
        for pipeline_id, job in list(self._jobs.items()):
            note = job.exit_note()
            cap_log(job.launch.log)
            sent = job.sent_result()
            if sent is not None and job.sent_at is None:
                job.sent_at = now
            if note is None and sent is None:
                deadline = job.launch.deadline
                if job.stop_reason is None and deadline is not None and now > deadline:
                    self._stop(job, f"killed after exceeding its max_runtime of {job.launch.max_runtime:g} s", now)
                elif job.stop_reason is not None and now - job.stopped_at > self.grace:
                    self._signal(job, signal.SIGKILL)
                continue
            if note is None and now - (job.sent_at or now) < RESULT_FILE_GRACE:
                continue  # its job ended: the supervisor is writing the result file and exiting
            del self._jobs[pipeline_id]
            if job.server is not None:
                job.server.forget(job.pid)
            if job.pipe is not None:
                job.pipe.close()
            results.append(_ending(job, note, sent))
        return results

    def running(self) -> set[int]:
        return set(self._jobs)

    def process(self, pipeline_id: int) -> tuple[int, str | None] | None:
        job = self._jobs.get(pipeline_id)
        return None if job is None or job.pid <= 0 else (job.pid, job.ticks)
