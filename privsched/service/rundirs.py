"""Where a database's runs live on disk: one folder per pipeline next to the database.

Layout, for a database ``DIR/NAME.db``::

    DIR/runs/NAME/pool.json          the compute pool the scheduler serves with
    DIR/runs/NAME/policy.json        its policy and unlock rule (make_policy's name and options)
    DIR/runs/NAME/condition          why the scheduler cannot make progress (storage full), while it lasts
    DIR/runs/NAME/reservations.json  round robin's reservations of the waiting pipelines, while it holds any
    DIR/runs/NAME/<id>/context.json  the job's context (JobContext JSON plus its job entry)
    DIR/runs/NAME/<id>/result.json   written by the job's supervisor when the job ends
    DIR/runs/NAME/<id>/job.log       the job's stdout and stderr
    DIR/runs/NAME/<id>/pid           the supervisor's process id and start time (local executor)
    DIR/runs/NAME/<id>/cancel        present when a user asked to cancel the running job
    DIR/runs/NAME/<id>/work/         the job's working folder: the only place it may write

Everything but ``work/`` is the scheduler's state: a confined job can neither read nor
change it (:mod:`privsched.jobs.sandbox`), so no job can alter another pipeline or the
scheduler. Folders are created ``0700`` and files ``0600``: readable by their owner only.

The files a job leaves in ``work/`` are its artifacts (:meth:`RunDirs.artifacts`,
:meth:`RunDirs.open_artifact`): regular files named by their path there, each at most
:data:`MAX_ARTIFACT` bytes. The job wrote that folder, so nothing it planted there is
followed: a name is a plain relative path, no part of it may be a link, and only a regular
file with one link is opened.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from privsched.errors import BadInput, NotFound
from privsched.results import ARTIFACT_NAME, MAX_ARTIFACT, Artifact, check_artifact_name

# The job runner and the pool (the specification models) are imported where they are used:
# a command that only reads a pipeline's state opens this folder and no more.
if TYPE_CHECKING:
    import numpy as np

    from privsched.service.resources import Pool

#: Longest condition text read back from the runs folder, in characters.
CONDITION_LENGTH = 1000
#: Most artifacts listed for one pipeline (the first in name order).
MAX_ARTIFACTS = 1000


class RunDirs:
    """Paths of a database's per-pipeline run files."""

    def __init__(self, db_path: str | os.PathLike) -> None:
        db = Path(db_path).resolve()
        self.db = db
        self.root = db.parent / "runs" / db.stem
        self._pool: tuple[tuple[int, int, int], Pool] | None = None  # the last pool read, under its file's identity

    def folder(self, pipeline_id: int, *, create: bool = False) -> Path:
        path = self.root / str(pipeline_id)
        if create:
            _private_folder(path)
        return path

    def workdir(self, pipeline_id: int) -> Path:
        """The job's working folder, the only one it may write to."""
        return self.folder(pipeline_id) / "work"

    def artifacts(self, pipeline_id: int) -> list[Artifact]:
        """The regular files the job left in its work folder, by name (links, folders reached
        through links, and names :data:`ARTIFACT_NAME` refuses are left out)."""
        root = self.workdir(pipeline_id)
        found: list[Artifact] = []
        for folder, dirs, names in os.walk(root):  # os.walk does not follow links to folders
            dirs.sort()
            for name in sorted(names):
                path = Path(folder, name)
                relative = path.relative_to(root).as_posix()
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and ARTIFACT_NAME.fullmatch(relative):
                    found.append(Artifact(relative, info.st_size))
                    if len(found) == MAX_ARTIFACTS:
                        return found
        return found

    def open_artifact(self, pipeline_id: int, name: str) -> tuple[BinaryIO, int]:
        """One artifact open for reading, and its size. A name outside :data:`ARTIFACT_NAME`
        raises :class:`~privsched.errors.BadInput`; a missing file, a link anywhere on its
        path, or anything but a regular file with one link :class:`~privsched.errors.NotFound`;
        a file over :data:`MAX_ARTIFACT` bytes ``BadInput``."""
        check_artifact_name(name)
        root = self.workdir(pipeline_id)
        fd = None
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            for part in name.split("/")[:-1]:  # each folder opened without following a link
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
            file = os.open(name.split("/")[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError:
            raise NotFound(f"pipeline {pipeline_id} has no artifact {name!r}") from None
        finally:
            if fd is not None:
                os.close(fd)
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(file)
            raise NotFound(f"pipeline {pipeline_id} has no artifact {name!r}")
        if info.st_size > MAX_ARTIFACT:
            os.close(file)
            raise BadInput(f"artifact {name!r} is {info.st_size} bytes, over the {MAX_ARTIFACT}-byte limit")
        return os.fdopen(file, "rb"), info.st_size

    def protected(self) -> list[str]:
        """What no job may be able to read: the ledger database, its journals, every run."""
        db = str(self.db)
        return [db, *(db + suffix for suffix in ("-wal", "-shm", "-journal")), str(self.root)]

    def context(self, pipeline_id: int) -> Path:
        return self.folder(pipeline_id) / "context.json"

    def result(self, pipeline_id: int) -> Path:
        return self.folder(pipeline_id) / "result.json"

    def log(self, pipeline_id: int) -> Path:
        return self.folder(pipeline_id) / "job.log"

    def pid_file(self, pipeline_id: int) -> Path:
        return self.folder(pipeline_id) / "pid"

    def cancel_request(self, pipeline_id: int) -> Path:
        return self.folder(pipeline_id) / "cancel"

    def request_cancel(self, pipeline_id: int) -> None:
        """Ask the scheduler to stop a running job (it kills it, then fails the pipeline)."""
        from privsched.jobs.runner import write_atomic

        write_atomic(self.folder(pipeline_id, create=True) / "cancel", "cancelled by user\n")

    def record_pool(self, pool: Pool) -> None:
        from privsched.jobs.runner import write_atomic

        _private_folder(self.root)
        write_atomic(self.root / "pool.json", json.dumps(pool.to_dict()))

    def condition(self) -> Path:
        """Where the serving scheduler says why it cannot make progress (docs/recovery.md)."""
        return self.root / "condition"

    def read_condition(self) -> str | None:
        """What the serving scheduler last reported keeps it from making progress (e.g.
        "storage full since …"), or None when nothing does. The file is the scheduler's own
        (no job can write it); only its first line, at most :data:`CONDITION_LENGTH`
        characters, is read."""
        return _first_line(self.condition())

    def record_job_starts(self, mode: str | None) -> None:
        """Record how the serving scheduler's executor starts the next job (see
        :meth:`~privsched.service.executors.base.Executor.start_mode`); None: it does not say."""
        from privsched.jobs.runner import write_atomic

        path = self.root / "job_starts"
        if mode is None:
            path.unlink(missing_ok=True)
            return
        _private_folder(self.root)
        write_atomic(path, mode + "\n")

    def read_job_starts(self) -> str | None:
        """How the serving scheduler last said it starts jobs ("warm", or "cold: why"), or None.
        Only the file's first line, at most :data:`CONDITION_LENGTH` characters, is read."""
        return _first_line(self.root / "job_starts")

    def record_policy(self, name: str, params: dict) -> None:
        """Record the serving policy as :func:`~privsched.policies.make_policy`'s name and
        options, so that waiting reasons rank and estimate unlocks as the scheduler does."""
        from privsched.jobs.runner import write_atomic

        _private_folder(self.root)
        write_atomic(self.root / "policy.json", json.dumps({"name": name, "params": params}))

    def recorded_policy(self) -> tuple[str, dict] | None:
        """The policy the last scheduler served this database with (name, options), if any."""
        try:
            data = json.loads((self.root / "policy.json").read_text())
            return str(data["name"]), dict(data["params"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record_reservations(self, reserved: Mapping[tuple[int, int], np.ndarray]) -> None:
        """Record round robin's reservations (by pipeline id and block id), so that waiting
        reasons see what the scheduler has set aside; none: the file is removed. Best effort:
        a write the disk refuses removes the file rather than leave an outdated one."""
        from privsched.jobs.runner import write_atomic

        path = self.root / "reservations.json"
        try:
            if reserved:
                _private_folder(self.root)
                write_atomic(path, json.dumps([[p, b, [float(x) for x in v]] for (p, b), v in reserved.items()]))
                return
        except OSError:
            pass
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)

    def recorded_reservations(self) -> dict[tuple[int, int], np.ndarray]:
        """Round robin's reservations the serving scheduler recorded (none if it holds none)."""
        import numpy as np

        try:
            rows = json.loads((self.root / "reservations.json").read_text())
            return {(int(p), int(b)): np.array(v, dtype=float) for p, b, v in rows}
        except (OSError, ValueError, TypeError):
            return {}

    def recorded_pool(self) -> Pool | None:
        """The pool the last scheduler served this database with, if any. Read again only
        when the file changed: it is replaced whole (:meth:`record_pool`, a rename), so a
        new version has a new inode, and an edit in place a new modification time or size;
        a submission then costs one ``stat`` instead of a read and a JSON parse."""
        from privsched.service.resources import Pool

        path = os.path.join(self.root, "pool.json")
        try:
            info = os.stat(path)
            identity = (info.st_ino, info.st_mtime_ns, info.st_size)
            if self._pool is not None and self._pool[0] == identity:
                return self._pool[1]
            with open(path, encoding="utf-8") as file:
                pool = Pool.from_dict(json.load(file))
        except (OSError, ValueError, KeyError):
            return None
        self._pool = (identity, pool)
        return pool


def _private_folder(path: Path) -> None:
    """Create a folder (and its missing parents) readable by its owner only."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def _first_line(path: Path) -> str | None:
    """The first line of a scheduler's note file, at most :data:`CONDITION_LENGTH`
    characters, or None when the file is missing or says nothing."""
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.readline(CONDITION_LENGTH).strip() or None
    except OSError:
        return None
