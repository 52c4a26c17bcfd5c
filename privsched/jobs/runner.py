"""Runs one granted job under a trusted supervisor and writes how it ended to a result file.

    python -m privsched.jobs.runner CONTEXT.json RESULT.json [--sandbox landlock|none] [--network]
                                    [--result-fd FD]

The context file is a :class:`~privsched.jobs.context.JobContext` in JSON with one more key,
``job``: a built-in trainer (``{"kind": ...}``) or user code (``{"function":
"module:qualname"}`` or ``"path/to/file.py:function"``, plus ``pythonpath`` folders to import
it from), and optionally ``protected``: paths the job must not be able to read (the ledger,
other blocks' data).

This process is the **supervisor**. It becomes a child subreaper
(``prctl(PR_SET_CHILD_SUBREAPER)``), forks the job's process, which confines itself with
Landlock (:mod:`privsched.jobs.sandbox`) *before* importing any job code, answers the job's
privacy primitives and brokers its data (:mod:`privsched.jobs.primitives`: the job's context
names its blocks by key only, and the supervisor passes it read-only descriptors of a block's
files when it first asks) and, when the job's process ends, kills every process it left
behind, detached or not. The supervisor alone writes the result (docs/design.md §4.4): a
built-in job is charged what it measured; a user job its whole grant unless, confined, it
never opened a block itself (then exactly what its primitives spent). A job that fails, is stopped
(``SIGTERM``: cancelled, timed out) or ends without reporting *before its first data access*
is charged nothing: the supervisor saw that access, if any, and the refund depends on no
data. After it, a failure consumes the grant; so does any failure of a job run without a
sandbox (which could reach its data around the broker). An executor that finds no result
file after the process ended fails the pipeline conservatively. The result also goes to the executor
through ``--result-fd`` (a pipe, which needs no disk), and the result file is retried while
the disk is full (:func:`deliver`), so a job that ends on a full disk keeps its result.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from privsched.jobs.context import BlockGrant, JobContext
from privsched.jobs.primitives import Account, Channel
from privsched.jobs.sandbox import (
    SANDBOX_MODES,
    Confinement,
    SandboxError,
    confine,
    exposed,
    python_roots,
    require_sandbox,
    sandbox_mode,
)

_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
#: How a failure message the job wrote itself (its exception) begins, and no message
#: privsched decides does: readers tell the job's own words from privsched's by it
#: (:func:`privsched.server.access.visible_message`).
JOB_RAISED = "the job raised "
#: The built-in jobs, loaded like a user's job: they live with the trainers, above this package.
BUILTIN_JOB = "privsched.trainers.builtin:run_builtin"


@dataclass(frozen=True)
class JobResult:
    """How a job ended, as the scheduler settles it in the ledger."""

    pipeline_id: int
    completed: bool
    #: Per granted block key, the budget spent (completed jobs only).
    spent: dict[str, list[float]] | None = None
    touched_data: bool = True
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    #: When (Unix time) the supervisor first gave the job its data (None: never, or unknown).
    first_access: float | None = None
    #: What the job's privacy primitives released: each one's query, ε, δ and value.
    releases: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=_jsonable)

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        data = json.loads(text)
        return cls(
            pipeline_id=int(data["pipeline_id"]),
            completed=bool(data["completed"]),
            spent=data.get("spent"),
            touched_data=bool(data.get("touched_data", True)),
            message=str(data.get("message", "")),
            metrics=dict(data.get("metrics") or {}),
            first_access=None if data.get("first_access") is None else float(data["first_access"]),
            releases=list(data.get("releases") or []),
        )


def _jsonable(value: Any) -> Any:
    """Metrics may hold NumPy or torch scalars and arrays."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def write_atomic(path: Path, text: str) -> None:
    """Write a file, readable by its owner only, so that readers see either nothing or the
    whole text."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as stream:
            stream.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


#: Errors that say the result file cannot be written now (no room, a read-only file system
#: or folder): retried until it can.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})


def deliver(result: JobResult, path: Path, result_fd: int | None = None, first_wait: float = 0.1, longest_wait: float = 10.0) -> None:
    """Hand the result to the scheduler: first through the executor's result pipe (which
    needs no disk), then in the result file, retried (waits doubling from ``first_wait`` to
    ``longest_wait`` seconds) for as long as the disk is full or the folder read-only
    (:data:`NO_ROOM`); any other error is raised."""
    text = result.to_json()
    if result_fd is not None:
        try:
            view = memoryview(text.encode() + b"\n")  # one line: the executor reads up to its end
            while view:
                view = view[os.write(result_fd, view) :]
        except OSError:
            pass  # the executor is gone (or stopped reading): the file alone will carry it
        finally:
            os.close(result_fd)
    wait = first_wait
    while True:
        try:
            write_atomic(path, text)
            return
        except OSError as exc:
            if exc.errno not in NO_ROOM:
                raise
        time.sleep(wait)
        wait = min(2 * wait, longest_wait)


def load_function(entry: str, pythonpath: list[str] | tuple[str, ...] = ()) -> Callable[..., Any]:
    """The callable named ``module:qualname`` (or ``file.py:qualname``)."""
    for folder in reversed(pythonpath):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    module_name, _, qualname = entry.rpartition(":")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load job file {module_name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"job {entry} is not callable")
    return target


def job_callable(job: dict[str, Any]) -> Callable[[JobContext], Any]:
    """The function a job runs: :data:`BUILTIN_JOB` for a built-in kind, else the user's."""
    if job.get("kind"):
        return load_function(BUILTIN_JOB)
    return load_function(job["function"], job.get("pythonpath", ()))


def job_confinement(document: dict[str, Any], ctx: JobContext, private: Path, network: bool) -> Confinement:
    """What a job may reach: the Python environment, privsched, the job's code (its module's
    file or its top-level package, while its ``pythonpath`` folders may only be listed), its
    work folder and private tmp (``private/tmp``). No block: every job, built-in or not,
    reads its data through descriptors its supervisor passes (:mod:`privsched.jobs.primitives`).
    Data-parallel processes of one job meet over its own namespace's loopback; a rank across
    nodes (a context with a ``rendezvous``) keeps the host network, TCP bind only on the
    rendezvous port and ephemeral ports (docs/sandbox.md)."""
    job = document["job"]
    pythonpath = [str(Path(p).resolve()) for p in job.get("pythonpath", ())]
    package = Path(__file__).resolve().parents[1]
    checkout = _source_checkout(package)
    here = str(Path.cwd().resolve())  # ``-m`` put the supervisor's folder, its run folder, on sys.path
    read = [root for root in python_roots() if root not in (checkout, here)] + [str(package)]
    read += _code_roots(str(job.get("function") or ""), pythonpath)
    listable = (*pythonpath, checkout) if checkout else tuple(pythonpath)
    write = (str(ctx.workdir), str(private / "tmp"))
    port = None if ctx.rendezvous is None else int(ctx.rendezvous["port"])
    loopback = ctx.workers > 1 and port is None
    return Confinement(read=tuple(read), write=write, listable=listable, network=network, loopback=loopback, rendezvous_port=port)


def _source_checkout(package: Path) -> str | None:
    """The folder holding the privsched package when it is a source checkout rather than the
    interpreter's own site-packages: jobs may list it (imports search it) but not read what
    lies beside the package there (a ledger, data, other runs)."""
    folder = package.parent
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    if any(folder == prefix or prefix in folder.parents for prefix in prefixes):
        return None
    return str(folder)


def _code_roots(entry: str, pythonpath: list[str]) -> list[str]:
    """The file of the job's module, or the folders of its top-level package, found the way
    the import will find them (without running any of the job's code)."""
    from importlib.machinery import PathFinder

    module = entry.rpartition(":")[0]
    if module.endswith(".py"):
        return [str(Path(module).resolve())]
    if not module:
        return []
    spec = PathFinder.find_spec(module.split(".")[0], [*pythonpath, *sys.path])
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [str(Path(p).resolve()) for p in spec.submodule_search_locations]
    return [str(Path(spec.origin).resolve())] if spec.origin else []


def _children(parent: int) -> list[int]:
    """Processes whose parent is ``parent`` (from /proc: works without CONFIG_PROC_CHILDREN)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def end_descendants() -> None:
    """Kill every process this one started, and their orphans, which a child subreaper
    inherits however they detached (double fork, ``setsid``), until none is left."""
    me = os.getpid()
    while True:
        children = _children(me)
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.005)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass  # reap every killed child; their orphans come up on the next scan
        except ChildProcessError:
            pass


def _prctl(option: int, value: int) -> None:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


#: Variables a job keeps from its supervisor's environment; every other is dropped (the
#: operator's tokens, cloud keys, the launch token). ``LC_*`` are kept as well.
JOB_VARIABLES = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
)
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def job_environment(inherited: dict[str, str] | os._Environ, home: Path, tmp: Path) -> dict[str, str]:
    """A job's whole environment: :data:`JOB_VARIABLES` and ``LC_*`` from ``inherited``,
    ``HOME`` its work folder and ``TMPDIR`` its private tmp; nothing else."""
    env = {name: value for name, value in inherited.items() if name in JOB_VARIABLES or name.startswith("LC_")}
    env.setdefault("PATH", _DEFAULT_PATH)
    return {**env, "HOME": str(home), "TMPDIR": str(tmp)}


def _erase_environment_block() -> None:
    """Zero the environment block this process was started with (what ``/proc/self/environ``
    shows, between the ``env_start`` and ``env_end`` fields of ``/proc/self/stat``,
    proc(5)): clearing ``os.environ`` does not touch it."""
    import ctypes

    with open("/proc/self/stat", "rb") as stream:
        stat = stream.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    env_start, env_end = int(fields[47]), int(fields[48])  # fields 50 and 51 of proc(5)
    if env_end > env_start:
        ctypes.memset(env_start, 0, env_end - env_start)


def _run_child(
    document: dict[str, Any], ctx: JobContext, rules: Confinement | None, sock: socket.socket, tmp: Path, private_fds: tuple[int, ...]
) -> None:
    """The job's process: close the supervisor's ``private_fds``, take its environment from
    the allow-list (:func:`job_environment`), enter its namespaces and confine itself
    (:mod:`privsched.jobs.namespaces`, Landlock, :mod:`privsched.jobs.seccomp`), then import
    and call the job; report to the supervisor over ``sock``. Never returns."""
    code = 0
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked in its supervisor until it was ready
        for fd in private_fds:
            os.close(fd)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        environment = job_environment(os.environ, ctx.workdir, tmp)
        os.environ.clear()
        os.environ.update(environment)
        if sys.platform.startswith("linux"):
            _erase_environment_block()
        tempfile.tempdir = str(tmp)
        os.chdir(ctx.workdir)
        if rules is not None:
            from privsched.jobs import namespaces, seccomp

            namespaces.isolate(rules, tmp.parent / "root", ctx.workdir)
            confine(rules)
            seccomp.install()
        job = document["job"]
        ctx.channel = Channel(sock)
        try:
            job_callable(job)(ctx)
            report = {"completed": True, "spent": None if ctx.spent is None else ctx.spent.tolist(), "metrics": ctx.metrics}
        except BaseException as exc:  # the job's own failure, whatever it is, is its result
            traceback.print_exc()
            message = f"{type(exc).__name__}: {exc}".splitlines()[0]
            report = {"completed": False, "message": message, "metrics": ctx.metrics}
        sys.stdout.flush()
        sys.stderr.flush()
        ctx.channel.finish(report)
    except BaseException:
        traceback.print_exc()
        code = 3
    finally:
        os._exit(code)


def supervise(document: dict[str, Any], mode: str = "landlock", network: bool = False, private_fds: tuple[int, ...] = ()) -> JobResult:
    """Run the job a context document describes in a confined child process and say how it
    ended; the child's own report is believed only where it cannot lie (module docstring).
    ``network``: whether the operator lets a job that asks for it (``job.network``) keep TCP;
    ``private_fds``: the supervisor's descriptors that the job's process closes first. On
    ``SIGTERM`` (a cancel, a timeout) the job's every process is killed and the job ends
    failed, charged nothing if it had not reached its data yet."""
    ctx = JobContext.from_json(json.dumps(document))
    builtin = bool(document["job"].get("kind"))
    network = network and bool(document["job"].get("network"))
    ctx.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for block in ctx.blocks.values():  # relative locations resolve from the job's work folder
        block.location = None if block.location is None else str(ctx.workdir / block.location)
    job_ctx = replace(ctx, blocks={key: BlockGrant(key, None, b.grant) for key, b in ctx.blocks.items()})  # keys, no locations
    private = Path(tempfile.mkdtemp(prefix="privsched-job-"))
    tmp = private / "tmp"
    tmp.mkdir(mode=0o700)
    try:
        rules = job_confinement(document, ctx, private, network) if mode == "landlock" else None
        if rules is not None:
            hits = exposed(rules.read, document.get("protected", ()), rules.write)
            if hits:
                return JobResult(
                    ctx.pipeline_id,
                    False,
                    touched_data=False,
                    message=f"not started: {hits[0]} lies in a folder the job may read (keep the ledger, its runs "
                    "and the data out of the Python environment, the job's code and the folder it starts in: for a "
                    "Ray job, the folder `ray start` ran in, which is on its Python path)",
                )
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _run_child(document, job_ctx, rules, theirs, tmp, private_fds)
        theirs.close()
        account = Account(ctx)
        status: list[int] = []
        stopped: list[int] = []

        def ended() -> bool:
            if not status:
                done, code = os.waitpid(pid, os.WNOHANG)
                status.extend([code] if done else [])
            return bool(status)

        previous = signal.signal(signal.SIGTERM, _stop_on_signal)
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # a stop that came early is taken now
            report = account.serve(ours, ended)
            if not status:
                status.append(os.waitpid(pid, 0)[1])
        except _Stopped as stop:
            report, stopped = None, [stop.signum]
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the job is being ended already
            end_descendants()
            signal.signal(signal.SIGTERM, previous)
            ours.close()
        if stopped:
            touched = _touched(account, builtin, rules is not None)
            message = f"the job was stopped (signal {stopped[0]}) before it ended"
            return JobResult(
                ctx.pipeline_id, False, touched_data=touched, message=message, first_access=account.first_access, releases=account.releases
            )
        return _result(ctx, builtin, rules is not None, account, report, status[0])
    finally:
        shutil.rmtree(private, ignore_errors=True)


class _Stopped(Exception):
    """The supervisor was asked to stop (``SIGTERM``) while its job ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signal(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_IGN)  # once: the supervisor is ending its job already
    raise _Stopped(signum)


def _touched(account: Account, builtin: bool, confined: bool) -> bool:
    """Whether a job that ended without completing must be charged its grant: it reached its
    data through the supervisor, or it ran user code unconfined (which may have reached its
    data around the broker)."""
    return account.first_access is not None or not (builtin or confined)


def _result(ctx: JobContext, builtin: bool, confined: bool, account: Account, report: dict | None, status: int) -> JobResult:
    """How the job is settled (docs/design.md §4.4). A built-in job's report is privsched's own code
    measuring its spend; a user job is charged its whole grant unless, confined, it never
    opened a block itself (then exactly what its primitives spent, nothing without). A failed job is charged its grant
    once it reached its data (:func:`_touched`), nothing before, whatever it says."""
    grant = {key: b.grant.tolist() for key, b in ctx.blocks.items()}
    unconfined_note = {} if confined else {"sandbox": "none"}
    touched, first, releases = _touched(account, builtin, confined), account.first_access, account.releases
    if not isinstance(report, dict):
        code = os.waitstatus_to_exitcode(status)
        note = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        message = f"job {note} without writing its result"
        return JobResult(ctx.pipeline_id, False, touched_data=touched, message=message, first_access=first, releases=releases)
    reported = report.get("metrics")
    metrics = {**(reported if isinstance(reported, dict) else {}), **unconfined_note}
    if not report.get("completed"):
        message = JOB_RAISED + str(report.get("message", ""))[:500]
        return JobResult(
            ctx.pipeline_id, False, touched_data=touched, message=message, metrics=metrics, first_access=first, releases=releases
        )
    if builtin:
        spent = grant if report.get("spent") is None else {key: report["spent"] for key in ctx.blocks}
    elif confined and not account.read_blocks:
        spent = {key: account.spent.tolist() for key in ctx.blocks}
    else:
        spent = grant
    return JobResult(ctx.pipeline_id, True, spent, True, "", metrics, first, releases)


def run_job(context_path: Path, mode: str = "landlock", network: bool = False, private_fds: tuple[int, ...] = ()) -> JobResult:
    """Supervise the job of a context file (see :func:`supervise`)."""
    return supervise(json.loads(context_path.read_text()), mode, network, private_fds)


def not_started(context_path: Path, reason: str) -> JobResult:
    """The result of a job refused before any of its code ran: failed, its data untouched
    (its grant is released)."""
    pipeline_id = int(json.loads(context_path.read_text())["pipeline_id"])
    return JobResult(pipeline_id, False, touched_data=False, message=f"not started: {reason}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m privsched.jobs.runner")
    parser.add_argument("context", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--sandbox", choices=SANDBOX_MODES, default=None)
    parser.add_argument("--network", action="store_true", help="let a job that asks for it keep TCP access")
    parser.add_argument("--result-fd", type=int, default=None, help="a pipe to send the result to as well")
    # A stop (SIGTERM) waits until the supervisor is ready to end its job and say so: one that
    # comes before then would kill it without a result, and its job would be charged as if it
    # had read its data (see supervise).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    args = parser.parse_args(argv)
    mode = sandbox_mode(args.sandbox)
    private = () if args.result_fd is None else (args.result_fd,)
    try:
        require_sandbox(mode)
        result = run_job(args.context, mode, args.network, private)  # the job's own ask is read there
    except SandboxError as exc:
        result = not_started(args.context, str(exc))
    deliver(result, args.result, args.result_fd)
    sys.stdout.flush()
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
