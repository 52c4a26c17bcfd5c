"""The result pipe: how a local job's result reaches the scheduler when no file can hold it.

The executor gives each supervisor the write end of a pipe (``--result-fd``); the supervisor
sends its result there before writing the result file (:func:`privsched.jobs.runner.deliver`),
and keeps retrying the file while the disk is full. The pipe needs no disk, so a job that
ends on a full disk is settled from what it measured, not charged in full as a job without a
result would be (issue 12, item 4). The file stays the durable copy: a scheduler restarted
in the meantime has no pipe and reads the file once the supervisor could write it. The job's
own processes never hold the pipe (the supervisor closes it in them before any job code runs).
"""

from __future__ import annotations

import os

from privsched.jobs.runner import JobResult

#: Largest result accepted through the pipe (the supervisor sends nothing larger).
LIMIT = 1 << 20


class ResultPipe:
    """The read end of one job's result pipe (non-blocking)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # neither end inherited unless passed on purpose
        for fd in (self.read_fd, self.write_fd):
            os.set_blocking(fd, False)
        self._data = bytearray()
        self._ended = False

    def handed_over(self) -> None:
        """Close this process's copy of the write end, once the supervisor has its own."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def result(self, pipeline_id: int) -> JobResult | None:
        """The result the supervisor sent, once all of it (one line of JSON) arrived; None
        before (or when what came is not a result of this pipeline)."""
        self._read()
        line, newline, _ = self._data.partition(b"\n")
        if not newline:
            return None
        try:
            result = JobResult.from_json(line.decode())
        except (ValueError, KeyError, TypeError):
            return None
        return result if result.pipeline_id == pipeline_id else None

    def _read(self) -> None:
        while not self._ended and self.read_fd >= 0:
            try:
                chunk = os.read(self.read_fd, 65536)
            except BlockingIOError:
                return
            self._data += chunk
            if not chunk or b"\n" in chunk or len(self._data) > LIMIT:
                self._ended = True
                self.close()

    def close(self) -> None:
        self.handed_over()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1
