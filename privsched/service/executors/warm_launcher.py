"""The executor's side of the fork server (:mod:`privsched.service.executors.fork_server`):
start it, launch jobs through it, learn how they exited, replace it when it dies.

A launch never waits for the fork server to warm up and never depends on it: while it is
starting, after it died, or when it does not answer, :meth:`WarmLauncher.launch` returns
None and the executor starts the job cold. A job is never started twice: the fork server
forks first and replies with the child's pid, and only then does the executor write the
child's spec into a pipe only it can write; a launch it gives up on closes that pipe empty,
so a child forked in the meantime exits without running anything.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import weakref
from typing import Any, Callable

from privsched.service.executors.base import LAUNCH_TOKEN_ENV
from privsched.service.executors.fork_server import TOKEN_ROOM, receive, send

#: What the fork server imports before it forks any job: the supervisor (and what it imports
#: lazily), the built-in jobs, their trainers and statistics (torch, Opacus and OpenDP
#: included, with the parts of them the jobs import lazily), what torch imports on a job's
#: first step (``torch._dynamo``, which every optimizer's constructor imports: about 1.5 s),
#: and the thread-pool control.
WARM_MODULES: tuple[str, ...] = (
    "argparse",
    "privsched.jobs.runner",
    "privsched.jobs.records",
    "privsched.trainers.builtin",
    "privsched.trainers.statistics",
    "privsched.trainers.dpsgd",
    "privsched.trainers.optimizers",
    "privsched.statistics.queries",
    "privsched.statistics.release",
    "opendp.domains",
    "opendp.measurements",
    "opendp.metrics",
    "opacus",
    "opacus.accountants",
    "opacus.optimizers",
    "opacus.grad_sample",
    "opacus.grad_sample.utils",
    "opacus.layers",
    "opacus.utils.fast_gradient_clipping_utils",
    "torch._dynamo",
    "torch.optim",
    "torch.utils.data",
    "threadpoolctl",
)
#: Longest wait for the fork server's reply to a launch before starting the job cold.
REPLY_SECONDS = 10.0
#: Wait before replacing a fork server that died, doubling while it dies before it is ready.
FIRST_RETRY_SECONDS, LAST_RETRY_SECONDS = 1.0, 300.0


def _shut(sock: socket.socket, process: subprocess.Popen) -> None:
    """Close the control socket and end the fork server (at once: it may be busy importing,
    and its jobs, each in its own session, run on)."""
    sock.close()
    if process.poll() is None:
        process.kill()
        process.wait()


class ForkServer:
    """One running fork server process and its control socket."""

    def __init__(self, python: str, env: dict[str, str], modules: tuple[str, ...]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_env = {
            **env,
            LAUNCH_TOKEN_ENV: TOKEN_ROOM,
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
        }
        try:
            self.process = subprocess.Popen(
                [python, "-m", "privsched.service.executors.fork_server", str(theirs.fileno()), *modules],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=server_env,
                cwd="/",
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False
        self.dead = False
        self.failure: str | None = None  # why it could not start, as it said before exiting
        self.children: set[int] = set()  # the jobs forked here that the executor watches
        self.exits: dict[int, int] = {}  # pid -> exit code (negative: killed by that signal)
        self._finalizer = weakref.finalize(self, _shut, ours, self.process)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _handle(self, message: dict[str, Any] | None) -> dict[str, Any] | None:
        """Note a ready or exit message; return any other (a reply)."""
        if message is None:
            self.stop()
        elif message.get("ready"):
            self.ready = True
        elif "failed" in message:
            self.failure = str(message["failed"])
        elif "exited" in message:
            if int(message["exited"]) in self.children:
                self.exits[int(message["exited"])] = int(message["status"])
        else:
            return message
        return None

    def drain(self) -> None:
        """Read every message waiting, without blocking."""
        try:
            while not self.dead and select.select([self.sock], [], [], 0)[0]:
                self._handle(receive(self.sock)[0])
        except (OSError, ValueError):
            self.stop()
        if not self.dead and self.process.poll() is not None:
            self.stop()

    def launch(self, spec: dict[str, Any], log_fd: int, result_fd: int) -> int | None:
        """Fork a job that runs ``spec`` (see the fork server's ``_become_job``) with its log
        and result pipe; its pid, or None when no job will run (the fork server died or did
        not answer: it is stopped)."""
        spec_read, spec_write = os.pipe2(os.O_CLOEXEC)
        pid = None
        try:
            send(self.sock, {"launch": 1}, [spec_read, log_fd, result_fd])
            os.close(spec_read)
            spec_read = -1
            pid = self._reply()
            if pid is not None:
                self.children.add(pid)
                with os.fdopen(spec_write, "wb") as stream:
                    spec_write = -1
                    stream.write(json.dumps(spec).encode())
        except (OSError, ValueError):
            self.stop()
            return None  # a child that was forked read an incomplete spec and exited
        finally:
            for fd in (spec_read, spec_write):
                if fd >= 0:
                    os.close(fd)
        return pid

    def _reply(self) -> int | None:
        deadline = time.monotonic() + REPLY_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.sock], [], [], left)[0]:
                break
            reply = self._handle(receive(self.sock)[0])
            if self.dead:
                return None
            if reply is not None:
                if "pid" not in reply:
                    return None
                return int(reply["pid"])
        self.stop()
        return None

    def exit_code(self, pid: int) -> int | None:
        """How a job forked here exited, once the fork server reaped it."""
        self.drain()
        return self.exits.get(pid)

    def forget(self, pid: int) -> None:
        """Stop watching a job."""
        self.children.discard(pid)
        self.exits.pop(pid, None)

    def stop(self) -> None:
        """Shut the fork server down; its jobs run on, each in its own session."""
        if not self.dead:
            self.dead = True
            self._finalizer()


class WarmLauncher:
    """Keeps one fork server running, replaced (with backoff) whenever it dies."""

    def __init__(self, python: str, env: Callable[[], dict[str, str]], modules: tuple[str, ...] = WARM_MODULES) -> None:
        """``env``: the environment to start a fork server with (read at each start)."""
        self.python, self.env, self.modules = python, env, modules
        self.server: ForkServer | None = None
        self.started = False  # whether a fork server was ever started
        self._retry_at = 0.0
        self._retry_wait = FIRST_RETRY_SECONDS
        self.failure: str | None = None  # why the last fork server that died could not start

    def revive(self) -> None:
        """Replace a fork server that died (none is started before the first launch)."""
        if self.started:
            self.maintain()

    def maintain(self) -> ForkServer | None:
        """The current fork server, started (or replaced) when there is none; it may still be
        warming up."""
        self.started = True
        server = self.server
        if server is not None:
            server.drain()
            if not server.dead:
                if server.ready:
                    self._retry_wait = FIRST_RETRY_SECONDS
                return server
            if not server.ready:
                self._retry_wait = min(2 * self._retry_wait, LAST_RETRY_SECONDS)
                self._note_failure(server.failure)
            self.server = None
        now = time.monotonic()
        if now >= self._retry_at:
            self._retry_at = now + self._retry_wait
            try:
                self.server = ForkServer(self.python, self.env(), self.modules)
            except OSError:
                self.server = None
        return self.server

    def _note_failure(self, reason: str | None) -> None:
        """Tell the operator, once per reason, why jobs start cold."""
        if reason is not None and reason != self.failure:
            print(f"privsched: jobs start cold: the fork server could not start ({reason})", file=sys.stderr, flush=True)
        self.failure = reason

    def launch(self, spec: dict[str, Any], log_fd: int, result_fd: int) -> tuple[ForkServer, int] | None:
        """Fork a job from a warm fork server: the server and the job's pid, or None when
        the job must be started cold."""
        server = self.maintain()
        if server is None or not server.ready:
            return None
        pid = server.launch(spec, log_fd, result_fd)
        return None if pid is None else (server, pid)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
