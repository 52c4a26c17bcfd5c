"""Privacy primitives: DP statistics a confined job asks its trusted supervisor for.

A user job is untrusted, so what it reports spending is not believed (docs/design.md §4.4). Its
spend is believed only when privsched computed the release itself: the job calls
``ctx.dp_count``, ``ctx.dp_sum``, ``ctx.dp_mean`` or ``ctx.dp_histogram``; the request
travels over a socket pair to the supervisor (:mod:`privsched.jobs.runner`), which reads the
granted blocks, charges the mechanism against what is left of the grant *before* releasing
anything, refuses a release beyond the grant, and answers with the noisy value only. A job
that used only primitives is charged exactly their sum (sequential composition: curves and
(ε, δ) add, docs/design.md §3.4); one that read a block itself is charged its whole grant.

The noise is the statistic code's (Laplace scale Δ/ε, Dwork & Roth 2014 Thm 3.6; Gaussian;
OpenDP's floating-point-safe samplers from OS entropy): :mod:`privsched.statistics`, which
the built-in statistic job releases with too.

The protocol is one JSON object per line each way: the job sends ``{"op": ...}`` and reads
``{"ok": value}`` or ``{"error": message}``; its last message is ``{"op": "done", ...}``.
"""

from __future__ import annotations

import json
import select
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from privsched.jobs.context import JobContext

#: Longest message either side accepts (a job's metrics included).
MAX_MESSAGE = 16 * 1024 * 1024
#: The statistics a job may ask for.
QUERIES: tuple[str, ...] = ("count", "sum", "mean", "histogram")


class PrimitiveRefused(PermissionError):
    """The supervisor refused a primitive: beyond the grant, or a bad request."""


class Channel:
    """The job's end of the socket pair: requests to the supervisor, one at a time."""

    def __init__(self, sock: socket.socket, mediates_blocks: bool) -> None:
        self._sock = sock
        self._file = sock.makefile("rwb")
        #: Whether block files are reached through the supervisor (confined user jobs).
        self.mediates_blocks = mediates_blocks

    def call(self, request: dict) -> Any:
        self._file.write(json.dumps(request).encode() + b"\n")
        self._file.flush()
        line = self._file.readline(MAX_MESSAGE)
        if not line:
            raise ConnectionError("the job supervisor is gone")
        answer = json.loads(line)
        if "error" in answer:
            raise PrimitiveRefused(answer["error"])
        return answer["ok"]

    def fetch_block(self, key: str) -> Path:
        """A private copy of a granted block's data, which the job may read but not change
        (the job is then charged its whole grant)."""
        return Path(self.call({"op": "block", "key": key}))

    def finish(self, report: dict) -> None:
        self._file.write(json.dumps({"op": "done", **report}, default=_jsonable).encode() + b"\n")
        self._file.flush()
        self._sock.shutdown(socket.SHUT_WR)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


@dataclass
class Account:
    """The supervisor's side: what a job spent through primitives, and whether it read a
    block itself. Block copies go to ``copies``, a folder the job may read, not write (so
    it cannot plant links there for the supervisor to write through)."""

    ctx: JobContext
    copies: Path
    spent: np.ndarray = field(init=False)
    used_primitives: bool = False
    read_blocks: bool = False
    _records: dict[str, np.ndarray] | None = None

    def __post_init__(self) -> None:
        self.spent = np.zeros(self.ctx.accounting.dims)

    def serve(self, sock: socket.socket, ended: Callable[[], bool]) -> dict | None:
        """Answer the job's requests until its process has ``ended()`` (processes it left
        behind may still hold the socket) or every holder closed it; returns the job's final
        report, if it sent one."""
        report, buffer, last_round = None, b"", False
        sock.settimeout(5.0)  # a job that stops reading cannot block the supervisor for long
        while True:
            ready = select.select([sock], [], [], 0.0 if last_round else 0.05)[0]
            if not ready:
                if last_round:
                    return report
                last_round = ended()
                continue
            chunk = sock.recv(1 << 16)
            if not chunk or len(buffer) + len(chunk) > MAX_MESSAGE:
                return report
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request, answer = self._answer(line)
                if request is not None:
                    report = request
                elif answer is not None:
                    try:
                        sock.sendall(answer)
                    except OSError:
                        return report

    def _answer(self, line: bytes) -> tuple[dict | None, bytes | None]:
        """(the final report, None) for a ``done`` message, else (None, the answer line)."""
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            if request.get("op") == "done":
                return request, None
            answer: dict = {"ok": self.handle(request)}
        except (ValueError, TypeError, KeyError, OSError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        return None, json.dumps(answer).encode() + b"\n"

    def handle(self, request: dict) -> Any:
        op = request.get("op")
        if op == "block":
            return str(self._copy_block(str(request["key"])))
        if op in QUERIES:
            return self._statistic(op, request)
        raise ValueError(f"unknown primitive {op!r}")

    def _copy_block(self, key: str) -> Path:
        if key not in self.ctx.blocks or self.ctx.blocks[key].location is None:
            raise KeyError(f"block {key!r} is not granted")
        self.read_blocks = True  # from now on the job is charged its whole grant
        source = Path(self.ctx.blocks[key].location)  # type: ignore[arg-type]
        if not source.exists():
            return source  # nothing to copy: the job gets the path, and fails to open it
        target = self.copies / str(list(self.ctx.blocks).index(key)) / source.name
        if target.exists():
            return target
        target.parent.mkdir(mode=0o700, parents=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copyfile(source, target)
        owner = self.copies.stat()  # the job's uid, which may not be this process's (nobody under root)
        for path in (target.parent, target, *target.rglob("*")):
            os.chown(path, owner.st_uid, owner.st_gid)
        return target

    def _statistic(self, query: str, request: dict) -> Any:
        from privsched.budgets.mechanisms import demand_vector
        from privsched.statistics.queries import StatisticJob, statistic_mechanism
        from privsched.statistics.release import dp_statistic

        if "mechanism" in request:
            raise ValueError("a primitive names its noise in 'noise' (laplace or gaussian), not 'mechanism'")
        epsilon, delta = float(request["epsilon"]), float(request.get("delta") or 0.0)
        if not (np.isfinite(epsilon) and epsilon > 0 and 0 <= delta < 1):
            raise ValueError("a primitive needs epsilon > 0 and 0 <= delta < 1")
        job = StatisticJob(
            query=query,
            column=request.get("column"),
            bounds=request.get("bounds"),
            bins=request.get("bins"),
            noise=request.get("noise", "laplace"),
        )
        mechanism = statistic_mechanism(job, epsilon, delta, self.ctx.accounting)
        total = self.spent + demand_vector(mechanism, self.ctx.accounting)
        if not np.all(total <= self.ctx.budget):
            raise PermissionError(f"a {query} at epsilon {epsilon:g} would exceed the pipeline's grant")
        records = self._load()
        n = len(next(v for v in records.values() if v.ndim >= 1))
        from privsched.jobs.records import column

        values = column(records, job.column) if job.column is not None else None
        self.spent, self.used_primitives = total, True  # charged before anything is released
        result = dp_statistic(job, mechanism, values, n)
        return result if query == "histogram" else result["value"]

    def _load(self) -> dict[str, np.ndarray]:
        if self._records is None:
            from privsched.jobs.records import read_block_files

            self._records = read_block_files([b.location for b in self.ctx.blocks.values() if b.location])
        return self._records
