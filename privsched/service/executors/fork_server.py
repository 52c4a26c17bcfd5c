"""The fork server: a process with the job runner and the trainers (torch, Opacus) already
imported, from which each job's supervisor is forked instead of started cold.

    python -m privsched.service.executors.fork_server CONTROL_FD MODULE...

The local executor starts it (:mod:`privsched.service.executors.warm_launcher`) with a clean
environment and only the control socket open: it never opens the ledger, a run folder or a
job's files, and never reads what a job is asked to do. It imports ``MODULE...``, says
``{"ready": true}`` (or ``{"failed": reason}`` and exits), then answers each request, a
message carrying three file descriptors (a pipe the executor fills with the job's launch
spec *after* the fork, the job's log and its result pipe,
:mod:`privsched.service.executors.result_pipe`), by forking and replying ``{"pid": ...}``;
it reaps its children and reports ``{"exited": pid, "status": ...}``. It exits when the executor closes the socket (or dies).

The forked child (:func:`_become_job`), before anything else runs in it: starts a new
session, keeps only the descriptors it needs, reads its spec (an empty one, when the executor
gave up on this launch, makes it exit at once: a job never runs twice), takes the spec's
environment (``CUDA_VISIBLE_DEVICES``, thread counts, the launch token, also written where
``/proc/<pid>/environ`` shows it so that recovery finds the process as it finds a cold one),
re-seeds every generator the parent's imports may have seeded (``random``, NumPy's global
generator, torch's CPU and CUDA generators) from OS entropy, limits its thread pools, and
then runs the job's supervisor (:func:`privsched.jobs.runner.main`), which confines the job
exactly as in a cold start.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from privsched.service.executors.base import LAUNCH_TOKEN_ENV

#: The fork server's own value of the launch token variable: room that each forked child
#: overwrites, in place, with its real token (tokens are shorter; never a valid token).
TOKEN_ROOM = "-" * 96
#: Largest message on the control socket.
MESSAGE_BYTES = 4096


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """One JSON message (and descriptors) on a ``SOCK_SEQPACKET`` socket."""
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and its descriptors; ``(None, [])`` at end of file."""
    data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


#: Device files through which a GPU driver is reached (NVIDIA, AMD's ROCm, WSL's GPU).
GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def _warm_up() -> None:
    """With torch imported, one tiny forward and backward pass on the CPU: torch initialises
    its kernels on their first call (about 0.2 s, a job's first step otherwise pays it). The
    fork server runs with one thread per pool, so no thread pool exists at a fork. Not where
    torch is built for GPUs and a GPU driver is present: the autograd engine counts the
    GPUs on its first backward pass, which initialises the driver, and the driver starts a
    thread (even with no device visible); a process must not fork with a thread running,
    and each job must initialise its GPUs itself, after its own ``CUDA_VISIBLE_DEVICES``."""
    torch = sys.modules.get("torch")
    if torch is None or (torch.backends.cuda.is_built() and any(os.path.exists(path) for path in GPU_DRIVER_FILES)):
        return
    layer = torch.nn.Linear(8, 2)
    loss = torch.nn.functional.cross_entropy(layer(torch.zeros(4, 8)), torch.zeros(4, dtype=torch.long))
    loss.backward()


#: madvise(2) advice: back a range with transparent huge pages, and collapse it into them now
#: (Linux 6.1; refused harmlessly by older kernels or where huge pages are off).
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25
_HUGE_PAGE = 1 << 21


def _into_huge_pages() -> None:
    """Move the fork server's own writable memory (its heap and anonymous mappings: the
    imported modules' objects and torch's allocations, about 280 MB) into 2 MiB pages, best
    effort. A fork copies, and an exit tears down, one page-table entry per page: with 4 KiB
    pages that cost each job about 8 ms in the fork and 11 ms in its exit, twice (the fork
    server forks the supervisor, which forks the job); with huge pages about 2 and 5 ms. A
    job that writes into a huge page gets its own copy of the 4 KiB it wrote, as before."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        writable_private = fields[1][1] == "w" and fields[1][3] == "p"
        if not writable_private or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        start, end = (int(address, 16) for address in fields[0].split("-"))
        start = (start + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
        end &= ~(_HUGE_PAGE - 1)
        if end > start and libc.madvise(start, end - start, _MADV_HUGEPAGE) == 0:
            libc.madvise(start, end - start, _MADV_COLLAPSE)


def _reap(control: socket.socket) -> None:
    """Report every child that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(control, {"exited": pid, "status": os.waitstatus_to_exitcode(status)})


def serve(control: socket.socket, modules: list[str]) -> None:
    """Import ``modules``, then fork a job for each request until the socket closes."""
    for name in modules:
        importlib.import_module(name)
    _warm_up()
    from privsched.jobs.namespaces import available

    available()  # tried once here (a fork, tens of ms): every supervisor forked from here inherits the answer
    from threadpoolctl import ThreadpoolController

    pools = ThreadpoolController()  # finds the loaded thread pools once (tens of ms), not in every job
    gc.freeze()  # what is loaded now is never collected: a forked job's collector leaves those pages shared
    _into_huge_pages()
    if len(os.listdir("/proc/self/task")) != 1:
        raise RuntimeError("the fork server started a thread: forking it would be unsafe")
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_write)
    send(control, {"ready": True})
    while True:
        readable, _, _ = select.select([control.fileno(), wake_read], [], [])
        if wake_read in readable:
            try:
                while os.read(wake_read, 512):
                    pass
            except BlockingIOError:
                pass  # drained: each byte was one signal
        _reap(control)
        if control.fileno() not in readable:
            continue
        request, fds = receive(control, max_fds=3)
        if request is None:
            return
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            send(control, {"error": "a launch needs its spec pipe, its log and its result pipe"})
            continue
        # The child starts with stops (SIGTERM) held until its supervisor can end its job and say so.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_read)
            os.close(wake_write)
            spec_fd, log_fd, result_fd = fds
            _become_job(spec_fd, log_fd, result_fd, pools)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in fds:
            os.close(fd)
        send(control, {"pid": pid})


def _become_job(spec_fd: int, log_fd: int, result_fd: int, pools: Any) -> None:
    """The forked child: set itself up as a cold-started supervisor would be, then run it.
    Never returns."""
    code = 3
    try:
        os.setsid()
        with os.fdopen(spec_fd, "rb") as stream:
            raw = stream.read()
        if not raw:
            os._exit(0)  # the executor gave up on this launch: it starts the job elsewhere
        spec = json.loads(raw)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(null)
        os.close(log_fd)
        from privsched.jobs.runner import deliver, main, not_started

        try:
            _take_over(spec, pools)
        except Exception as exc:  # nothing of the job ran: refused, its grant released
            deliver(
                not_started(Path(spec["argv"][0]), f"the fork server's child could not be set up: {exc}"), Path(spec["argv"][1]), result_fd
            )
            code = 1
            return
        argv = [*spec["argv"], "--result-fd", str(result_fd)]
        sys.argv = ["privsched.jobs.runner", *argv]
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _take_over(spec: dict[str, Any], pools: Any) -> None:
    """Become the process a cold start of ``spec`` would be: its environment (and launch
    token), its folder, fresh entropy, its thread pools."""
    os.environ.clear()
    os.environ.update(spec["env"])
    _show_token(spec["env"].get(LAUNCH_TOKEN_ENV, TOKEN_ROOM))
    os.chdir(spec["cwd"])
    _reseed()
    _limit_threads(int(spec["threads"]), pools)


def _show_token(token: str) -> None:
    """Write ``token`` over :data:`TOKEN_ROOM` in the memory that ``/proc/<pid>/environ``
    reads (the environment block the process was started with, between the ``env_start``
    and ``env_end`` fields of ``/proc/<pid>/stat``, proc(5)), so that a recovering scheduler
    finds this process by its launch token exactly as it finds a cold-started one."""
    import ctypes

    entry = f"{LAUNCH_TOKEN_ENV}={TOKEN_ROOM}".encode()
    with open("/proc/self/stat", "rb") as stream:
        stat = stream.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    env_start, env_end = int(fields[47]), int(fields[48])  # fields 50 and 51 of proc(5)
    with open("/proc/self/environ", "rb") as stream:
        block = stream.read()
    offset = (b"\0" + block).find(b"\0" + entry + b"\0")
    if offset < 0 or env_start + offset + len(entry) > env_end or len(token) > len(TOKEN_ROOM):
        raise RuntimeError("the fork server's environment has no room for the launch token")
    shown = f"{LAUNCH_TOKEN_ENV}={token}".encode().ljust(len(entry), b"\0")
    ctypes.memmove(env_start + offset, shown, len(shown))


def _reseed() -> None:
    """Fresh OS entropy for every generator this process inherited from the fork server
    (``random`` re-seeds itself after a fork; NumPy's and torch's global generators do not)."""
    import random

    random.seed(os.urandom(32))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # None: fresh entropy from the OS
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)  # CPU and every CUDA device


def _limit_threads(threads: int, pools: Any) -> None:
    """The job's thread pools (``pools``: a ``threadpoolctl.ThreadpoolController``) sized to
    its CPUs, as ``OMP_NUM_THREADS`` and friends do for a cold start (the libraries read those
    variables when the fork server loaded them)."""
    pools.limit(limits=threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if sys.path and sys.path[0] == os.getcwd():
        del sys.path[0]  # ``-m`` put this process's folder ("/") first; jobs read every sys.path folder
    control = socket.socket(fileno=int(args[0]))
    try:
        serve(control, args[1:])
    except Exception as error:
        reason = f"{type(error).__name__}: {error}".splitlines()[0][: MESSAGE_BYTES // 2]
        try:
            send(control, {"failed": reason})
        except OSError:
            pass  # the executor is gone
        raise
    finally:
        control.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
