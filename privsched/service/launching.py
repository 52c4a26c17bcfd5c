"""The files that make a job launch recoverable: the launch lock and the spawn marker.

A launch takes these steps (``docs/recovery.md`` says what recovery does after a crash at
each one):

1. take the pipeline's launch lock (``flock`` on ``launches/<id>.lock`` in the runs folder);
2. ledger: granted → running, launch ``launching`` with a random token (fenced write);
3. write the spawn marker (``launches/<id>.spawn``, holding the token);
4. the executor starts the process, with the token in its environment, and writes its pid;
5. ledger: launch ``started`` with the pid and start time; release the lock.

A recovering scheduler resolves a ``launching`` record only while it holds the lock, which
the kernel frees when the launching scheduler dies, so a launcher that is merely paused
(and may still start the process when it resumes) is waited for, never raced. Holding the
lock, the absence of the marker proves that no process was ever started (step 4 comes after
step 3), so the grant is released; with the marker, the process is found and adopted, or
settled conservatively (docs/design.md §4.4). Both files live outside the job's own run folder,
which the (untrusted) job may write.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from privsched.jobs.runner import write_atomic


class LaunchLock:
    """An exclusive ``flock`` on a pipeline's launch lock file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, wait: bool = True) -> bool:
        """Take the lock; without ``wait``, False when another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> LaunchLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class LaunchFiles:
    """The launch lock and spawn marker of each pipeline, under ``<runs root>/launches``."""

    def __init__(self, runs_root: Path) -> None:
        self.folder = runs_root / "launches"

    def lock(self, pipeline_id: int) -> LaunchLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        return LaunchLock(self.folder / f"{pipeline_id}.lock")

    def _marker(self, pipeline_id: int) -> Path:
        return self.folder / f"{pipeline_id}.spawn"

    def mark_spawning(self, pipeline_id: int, token: str) -> None:
        """Step 3: record, before any process exists, that launch ``token`` is about to start one."""
        write_atomic(self._marker(pipeline_id), token)

    def clear_spawn_marker(self, pipeline_id: int) -> None:
        """Undo step 3 when starting the process failed: no process exists."""
        self._marker(pipeline_id).unlink(missing_ok=True)

    def spawn_was_attempted(self, pipeline_id: int, token: str) -> bool:
        """Whether launch ``token`` got as far as starting a process (step 3 was done)."""
        try:
            return self._marker(pipeline_id).read_text() == token
        except OSError:
            return False
