"""Privacy primitives: DP statistics a confined job asks its trusted supervisor for.

A user job is untrusted, so what it reports spending is not believed (docs/design.md §4.4). Its
spend is believed only when privsched computed the release itself: the job calls
``ctx.dp_count``, ``ctx.dp_sum``, ``ctx.dp_mean``, ``ctx.dp_histogram`` or ``ctx.dp_sgd`` (whose
training plan, not its training, is computed and charged here); the request
travels over a socket pair to the supervisor (:mod:`privsched.jobs.runner`), which reads the
granted blocks, charges the mechanism against what is left of the grant *before* releasing
anything, refuses a release beyond the grant, and answers with the noisy value only. A job
that used only primitives is charged exactly their sum (sequential composition: curves and
(ε, δ) add, docs/design.md §3.4); one that read a block itself is charged its whole grant.

The noise is the statistic code's (Laplace scale Δ/ε, Dwork & Roth 2014 Thm 3.6; Gaussian;
OpenDP's floating-point-safe samplers from OS entropy): :mod:`privsched.statistics`, which
the built-in statistic job releases with too.

The supervisor is also the job's only way to its data (the data broker): the job's context
names its blocks by key, never by location, and ``{"op": "open", "key": ...}`` is answered
with the names of the block's files and, on the same message (``SCM_RIGHTS``), one descriptor
per file that the supervisor opened read-only. The job's first access, through ``open`` or a
primitive, is recorded (:attr:`Account.first_access`) before any data moves: a job that ends
before it is charged nothing (docs/privacy.md).

The protocol is one JSON object per line each way: the job sends ``{"op": ...}`` and reads
``{"ok": value}`` or ``{"error": message}``; its last message is ``{"op": "done", ...}``.
"""

from __future__ import annotations

import array
import json
import os
import select
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Literal

import numpy as np

from privsched.jobs.context import JobContext, block_file_paths
from privsched.jobs.contribution import Contribution

#: Longest message either side accepts (a job's metrics included).
MAX_MESSAGE = 16 * 1024 * 1024
#: The statistics a job may ask for.
QUERIES: tuple[str, ...] = ("count", "sum", "mean", "histogram")
#: Most files a block may hold: their descriptors travel on one message (the kernel's
#: ``SCM_MAX_FD`` is 253).
MAX_BLOCK_FILES = 250


class PrimitiveRefused(PermissionError):
    """The supervisor refused a primitive: beyond the grant, or a bad request."""


class Channel:
    """The job's end of the socket pair: requests to the supervisor, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""
        self._fds: list[int] = []  # descriptors received with the answer being read

    def call(self, request: dict) -> Any:
        self._sock.sendall(json.dumps(request).encode() + b"\n")
        answer = json.loads(self._line())
        if "error" in answer:
            self._close_fds()
            raise PrimitiveRefused(answer["error"])
        return answer["ok"]

    def _line(self) -> bytes:
        """The next answer line, keeping the descriptors that came with it."""
        while b"\n" not in self._buffer:
            data, fds, _, _ = socket.recv_fds(self._sock, 1 << 16, MAX_BLOCK_FILES)
            self._fds += fds
            if not data:
                raise ConnectionError("the job supervisor is gone")
            if len(self._buffer) + len(data) > MAX_MESSAGE:
                raise ConnectionError("the job supervisor's answer is too long")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _close_fds(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def open_block(self, key: str) -> dict[str, BinaryIO]:
        """A granted block's files, by name within the block, as read-only files the
        supervisor opened (the job is then charged its whole grant)."""
        names = self.call({"op": "open", "key": key})
        return {str(name): file for name, file in zip(names, self._received_files(len(names)))}

    def dpsgd_plan(self, request: dict) -> tuple[dict, list[BinaryIO]]:
        """A charged DP-SGD plan (:meth:`Account._dpsgd_plan`) and the granted blocks' files,
        open for reading."""
        plan = self.call({"op": "dpsgd_plan", **request})
        return plan, self._received_files(plan.get("files"))

    def _received_files(self, expected: int | None) -> list[BinaryIO]:
        """The descriptors that came with the last answer, as files open for reading; all of
        them closed and ``ConnectionError`` unless there are ``expected`` of them."""
        fds, self._fds = self._fds, []
        if len(fds) != expected:
            for fd in fds:
                os.close(fd)
            raise ConnectionError("the job supervisor's answer came without the descriptors it names")
        return [os.fdopen(fd, "rb") for fd in fds]

    def finish(self, report: dict) -> None:
        self._sock.sendall(json.dumps({"op": "done", **report}, default=_jsonable).encode() + b"\n")
        self._sock.shutdown(socket.SHUT_WR)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


@dataclass
class Account:
    """The supervisor's side: what a job spent through primitives, whether it opened a
    block itself, and when it first reached its data (``ctx`` is the supervisor's context,
    which holds the blocks' locations)."""

    ctx: JobContext
    spent: np.ndarray = field(init=False)
    read_blocks: bool = False
    #: When (Unix time) the job first reached its blocks' data, through a block or a
    #: primitive; set before any data is read or sent (None: it never did).
    first_access: float | None = None
    #: What the primitives released, in order: each one's query, ε, δ and value.
    releases: list[dict[str, Any]] = field(default_factory=list)
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
                request, answer, fds = self._answer(line)
                if request is not None:
                    report = request
                elif answer is not None:
                    try:
                        _send(sock, answer, fds)
                    except OSError:
                        return report
                    finally:
                        for fd in fds:
                            os.close(fd)

    def _answer(self, line: bytes) -> tuple[dict | None, bytes | None, list[int]]:
        """(the final report, None, []) for a ``done`` message, else (None, the answer line,
        the descriptors to send with it)."""
        fds: list[int] = []
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            if request.get("op") == "done":
                return request, None, []
            if request.get("op") == "open":
                names, fds = self.open_block(str(request["key"]))
                answer: dict = {"ok": names}
            elif request.get("op") == "dpsgd_plan":
                plan, fds = self._dpsgd_plan(request)
                answer = {"ok": plan}
            else:
                answer = {"ok": self.handle(request)}
        except (ValueError, TypeError, KeyError, OSError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        return None, json.dumps(answer).encode() + b"\n", fds

    def handle(self, request: dict) -> Any:
        op = request.get("op")
        if op in QUERIES:
            return self._statistic(op, request)
        raise ValueError(f"unknown primitive {op!r}")

    def _reach_data(self) -> None:
        """Record the job's first access to its data (before any of it is read)."""
        if self.first_access is None:
            self.first_access = time.time()

    def open_block(self, key: str) -> tuple[list[str], list[int]]:
        """The names of a granted block's files and a read-only descriptor for each; the job
        is charged its whole grant from now on."""
        if key not in self.ctx.blocks or self.ctx.blocks[key].location is None:
            raise KeyError(f"block {key!r} is not granted")
        files = self._block_files(self.ctx.blocks[key].location)  # type: ignore[arg-type]
        opened = self._descriptors(files)  # a block without the user column fails here, on its schema alone
        self._reach_data()
        self.read_blocks = True
        return opened

    def _block_files(self, location: str) -> dict[str, Path]:
        files = block_file_paths(location)
        if len(files) > MAX_BLOCK_FILES:
            raise ValueError(f"a block holds more than {MAX_BLOCK_FILES} files")
        return files

    def _descriptors(self, files: dict[str, Path]) -> tuple[list[str], list[int]]:
        """A read-only descriptor for each of a block's files; for a dataset whose unit is a
        person, one in-memory Parquet file of the block's rows, at most K of each person
        (:mod:`privsched.jobs.contribution`), so that no job ever reads more of anyone."""
        if self.ctx.contribution is not None:
            return [""], [_bounded_block(files, self.ctx.contribution)]
        fds: list[int] = []
        try:
            for path in files.values():
                fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return list(files), fds

    def _statistic(self, query: Literal["count", "sum", "mean", "histogram"], request: dict) -> Any:
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
        k = 1 if self.ctx.contribution is None else self.ctx.max_rows_per_user
        mechanism = statistic_mechanism(job, epsilon, delta, self.ctx.accounting, k)
        total = self.spent + demand_vector(mechanism, self.ctx.accounting)
        if not np.all(total <= self.ctx.budget):
            raise PermissionError(f"a {query} at epsilon {epsilon:g} would exceed the pipeline's grant")
        records = self._load()
        n = len(next(v for v in records.values() if v.ndim >= 1))
        from privsched.jobs.records import column

        values = column(records, job.column) if job.column is not None else None
        self.spent = total  # charged before anything is released
        result = dp_statistic(job, mechanism, values, n, k)
        released = result if query == "histogram" else result["value"]
        self.releases.append({"query": query, "column": job.column, "epsilon": epsilon, "delta": delta, "value": released})
        return released

    def _dpsgd_plan(self, request: dict) -> tuple[dict, list[int]]:
        """A DP-SGD training plan for ``ctx.dp_sgd`` (:mod:`privsched.budgets.training_plan`),
        computed and charged here from what is left of the grant *before* the job gets the
        records to train on: the charge rests on the plan, never on the job's report. The
        answer is the plan (q, σ, steps, its charge) with a read-only descriptor for each file
        of the granted blocks, which do not count as the job reading its blocks itself (the
        plan paid for the training). On a dataset whose unit is a person, q is the rate at
        which the job samples people (:mod:`privsched.trainers.people`) and the descriptors
        hold at most K rows of each; a block without the user column fails here, before
        anything is charged."""
        from privsched.budgets.training_plan import plan_training

        epsilon = request.get("epsilon")
        plan = plan_training(
            float(request["sample_rate"]),
            float(request["epochs"]),
            None if epsilon is None else float(epsilon),
            self.ctx.delta,
            self.ctx.budget - self.spent,
            self.ctx.accounting,
            self.ctx.epsilon,
        )
        total = self.spent + plan.charge
        if not np.all(total <= self.ctx.budget):
            raise PermissionError("the DP-SGD plan would exceed the pipeline's grant")
        fds: list[int] = []
        try:
            for block in self.ctx.blocks.values():
                if block.location:
                    fds += self._descriptors(self._block_files(block.location))[1]
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            raise
        if len(fds) > MAX_BLOCK_FILES:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"the granted blocks hold more than {MAX_BLOCK_FILES} files")
        self.spent = total  # charged before any record reaches the job
        self._reach_data()
        return {**plan.to_dict(), "files": len(fds)}, fds

    def _load(self) -> dict[str, np.ndarray]:
        if self._records is None:
            from privsched.jobs.records import block_source, read_block_files

            self._reach_data()
            self._records = read_block_files(
                [block_source(block_file_paths(b.location)) for b in self.ctx.blocks.values() if b.location], bound=self.ctx.contribution
            )
        return self._records


def _bounded_block(files: dict[str, Path], bound: Contribution) -> int:
    """A descriptor of an in-memory Parquet file holding a block's rows, at most K of each
    person (the block's files are its segments, in name order)."""
    import pyarrow.parquet as pq

    from privsched.jobs.records import block_source, parquet_block

    table = parquet_block(block_source(files), bound=bound)
    fd = os.memfd_create("privsched-block", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as out:
            pq.write_table(table, out)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _send(sock: socket.socket, answer: bytes, fds: list[int]) -> None:
    """One answer line, with ``fds`` on its first byte."""
    if not fds:
        sock.sendall(answer)
        return
    sent = sock.sendmsg([answer], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    if sent < len(answer):  # not an empty send: the job may have read its answer and gone
        sock.sendall(answer[sent:])
