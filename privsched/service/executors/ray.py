"""The Ray executor: each granted job runs as a Ray job (the Ray Jobs API) on a cluster.

Why Ray jobs rather than tasks or actors: a job submitted through ``JobSubmissionClient``
is owned by the cluster, not by the process that submitted it. It keeps running when the
scheduler stops, is found again under its ``submission_id``, keeps its output as logs on
the cluster and is stopped with ``stop_job`` (SIGTERM, then SIGKILL). Tasks and actors
share the fate of their driver, so a scheduler restart would kill every running job.

- **Resources.** A job asks for its placement's GPUs, CPUs and memory as
  ``entrypoint_num_gpus``, ``entrypoint_num_cpus`` and ``entrypoint_memory``: one Ray
  resource request on one node, so a multi-GPU job gets all its GPUs or waits, and Ray sets
  ``CUDA_VISIBLE_DEVICES`` to them. Before submitting, the request is checked against every
  alive node's total resources: one that no node can ever hold is refused
  (:class:`UnplaceableJob`) instead of waiting on the cluster forever.
- **Across nodes.** With the operator's ``train_across_nodes``, a data-parallel DP-SGD job
  (``workers`` > 1) runs as Ray Train's ``TorchTrainer``, one confined rank per worker,
  wherever Ray places them (:mod:`.ray_train`, :func:`across_nodes`); without it, one whose
  ranks no node holds is refused.
- **Context and result.** The job's context travels in the submission's environment and
  its result comes back as a marked line of its output (:mod:`.ray_entry`): workers never
  open the database. The result is also written to the run folder's result file.
- **Stable ids.** A job's ``submission_id`` is derived from its database's run folder, its
  pipeline id and its start time as recorded in the ledger, so a restarted scheduler finds
  the jobs an earlier one submitted (:meth:`RayExecutor.attach`), and Ray itself refuses a
  second submission of the same job.
- **Confinement.** The entry runs the job under the same supervisor and Landlock sandbox as
  the local executor (:mod:`privsched.jobs.runner`), with the operator's sandbox mode in the
  job's environment; a worker whose kernel has no Landlock refuses the job.
- **Logs.** The Ray job's output is copied into the pipeline's log file as it runs.
- **Authentication.** A cluster with Ray's token authentication (``RAY_AUTH_MODE=token``,
  Ray ≥ 2.52) answers its dashboard's HTTP APIs only to a bearer token. The executor sends
  the operator's token (:func:`operator_token`: the ``token`` given, else Ray's own sources,
  ``RAY_AUTH_TOKEN``, the file named by ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``) in
  the ``Authorization`` header of every Jobs and State API request, and nowhere else: never
  in a job's environment, a log or a message. A cluster that wants a token and gets none,
  or a wrong one, is a one-line error when the executor is made. Jobs never see it: the
  entry drops Ray's token variables before the job starts (:mod:`.ray_entry`).
- **Ending.** A job that printed a result is settled by it. One stopped on the cluster, or
  that ended without a result, fails with its data assumed touched, except when Ray reports
  that its command never started, or its supervisor, stopped by ``SIGTERM``, printed that the
  job had not reached its data yet (docs/design.md §4.4).

``ray`` is imported only when a :class:`RayExecutor` is made.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from privsched.jobs.runner import JobResult, write_atomic
from privsched.service.executors.base import Executor, Launch, failure, read_result
from privsched.jobs.sandbox import SANDBOX_VARIABLE
from privsched.service.executors.ray_entry import JOB_VARIABLE, NETWORK_VARIABLE, encode_document, parse_result
from privsched.service.executors.ray_train import RANKS_VARIABLE, RankShape, rank_refusal
from privsched.service.logcap import cap_log
from privsched.service.resources import Placement, Pool, make_pool

#: Ray error types of jobs whose command never started: their data was not touched.
NEVER_STARTED = frozenset(
    {
        "RUNTIME_ENV_SETUP_FAILURE",
        "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
        "JOB_SUPERVISOR_ACTOR_START_FAILURE",
        "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE",
        "JOB_ENTRYPOINT_COMMAND_START_ERROR",
    }
)
#: Largest encoded context a submission carries (an environment variable's limit is 128 KiB).
MAX_CONTEXT_BYTES = 120 * 1024
#: Polls after which a job that ended with unreadable output is settled without it (failed).
UNREADABLE_POLLS = 20
#: What a request to the cluster raises when it cannot answer (requests' errors are OSErrors;
#: Ray's AuthenticationError, a token the cluster stopped accepting, joins them in each executor).
_CLUSTER_ERRORS: tuple[type[BaseException], ...] = (OSError, RuntimeError)
#: Ray's sources of the cluster token, in its order of precedence (docs.ray.io, "Ray token authentication").
TOKEN_VARIABLE, TOKEN_PATH_VARIABLE = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_PATH = Path("~/.ray/auth_token")


class UnplaceableJob(OSError):
    """A job no node of the cluster can ever hold (or whose context is too large to send)."""


def operator_token(token: str | None = None) -> str | None:
    """The operator's Ray token: ``token``, else ``$RAY_AUTH_TOKEN``, else the contents of the
    file ``$RAY_AUTH_TOKEN_PATH`` names (which must be readable), else ``~/.ray/auth_token``
    if it exists, else None. Surrounding whitespace is dropped. ``ValueError`` (one line,
    without the token) for a file that cannot be read or a token that cannot travel in a header."""
    if token is None:
        token = os.environ.get(TOKEN_VARIABLE) or None
    if token is None:
        named = os.environ.get(TOKEN_PATH_VARIABLE)
        path = Path(named) if named else DEFAULT_TOKEN_PATH.expanduser()
        try:
            token = path.read_text().strip() if named or path.is_file() else None
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the Ray token file {str(path)!r}: {_first_line(exc)}") from None
    if token is None:
        return None
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise ValueError("the Ray token is empty or holds characters an HTTP header cannot carry")
    return token


def _auth_refusal(exc: BaseException, where: str) -> str:
    """One line for Ray's AuthenticationError (401: no token, 403: a wrong one)."""
    if str(exc).startswith("Authentication required"):
        return (
            f"the Ray cluster at {where} requires an authentication token: set {TOKEN_VARIABLE} or "
            f"{TOKEN_PATH_VARIABLE}, or write it to {DEFAULT_TOKEN_PATH}"
        )
    return f"the Ray cluster at {where} refused the Ray token: it is invalid or incorrect"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def submission_id(launch: Launch) -> str:
    """The job's stable Ray id: ``privsched-<database>-<pipeline>-<digest>``, the digest
    covering the database's run folder and the job's recorded start time."""
    runs_root = launch.context.parent.parent.resolve()
    digest = hashlib.sha1(f"{runs_root}|{launch.pipeline_id}|{launch.started_at!r}".encode()).hexdigest()[:10]
    database = re.sub(r"[^A-Za-z0-9_.-]", "_", runs_root.name)[:40]
    return f"privsched-{database}-{launch.pipeline_id}-{digest}"


def node_refusal(placement: Placement, nodes: list[dict[str, float]]) -> str | None:
    """Why no node can ever hold the job (``nodes``: each alive node's total resources),
    or None if one can."""
    for node in nodes:
        if (
            len(placement.gpus) <= node.get("GPU", 0)
            and placement.cpus <= node.get("CPU", 0) + 1e-9
            and placement.memory <= node.get("memory", 0)
        ):
            return None
    largest = max(nodes, key=lambda n: (n.get("GPU", 0), n.get("CPU", 0), n.get("memory", 0)), default={})
    return (
        f"no node of the Ray cluster can hold {len(placement.gpus)} GPU(s), {placement.cpus:g} CPU(s) and "
        f"{placement.memory / 2**30:.3g} GiB of memory (largest node: {largest.get('GPU', 0):g} GPU(s), "
        f"{largest.get('CPU', 0):g} CPU(s), {largest.get('memory', 0) / 2**30:.3g} GiB; {len(nodes)} node(s) alive)"
    )


def cluster_pool(nodes: list[dict[str, float]]) -> Pool:
    """The whole cluster as a pool: its GPUs (named 0..N-1), CPUs and task memory."""
    gpus = int(sum(n.get("GPU", 0) for n in nodes))
    return Pool(tuple(str(i) for i in range(gpus)), sum(n.get("CPU", 0) for n in nodes), int(sum(n.get("memory", 0) for n in nodes)))


def across_nodes(placement: Placement, workers: int, nodes: list[dict[str, float]], allowed: bool) -> RankShape | None:
    """How a job of ``workers`` ranks trains across nodes (Ray Train, :mod:`.ray_train`), or
    None when it runs as one Ray job on one node: a data-parallel job's ranks train across
    nodes whenever the operator allows it (``allowed``). Raises :class:`UnplaceableJob` for a
    job no node holds, unless its ranks may go across nodes, and for more ranks than the
    alive nodes can hold at once."""
    one_node = node_refusal(placement, nodes)
    if workers < 2 or not (allowed or one_node):
        if one_node:
            raise UnplaceableJob(one_node)
        return None
    if not allowed:
        raise UnplaceableJob(f"{one_node}, and the scheduler does not train across nodes (serve --train-across-nodes)")
    shape = RankShape.of(placement, workers)
    refusal = rank_refusal(shape, nodes)
    if refusal is not None:
        raise UnplaceableJob(refusal)
    return shape


def _environment(placement: Placement, encoded: str, sandbox: str, allow_network: bool) -> dict[str, str]:
    """The job's environment: its context, its sandbox, thread pools sized to its CPUs, and
    no GPU when it has none (Ray sets ``CUDA_VISIBLE_DEVICES`` to the GPUs it assigns)."""
    threads = str(max(1, int(placement.cpus)))
    env = {
        JOB_VARIABLE: encoded,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        SANDBOX_VARIABLE: sandbox,
        NETWORK_VARIABLE: "1" if allow_network else "0",
    }
    if not placement.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@dataclass
class _Job:
    launch: Launch
    submission_id: str
    copied: int = 0  # bytes of the Ray job's output already in the log file
    stop_reason: str | None = None
    stop_sent: bool = False
    logs_at: float = 0.0
    unread: int = 0  # polls that found the job ended but could not read its output


class RayExecutor(Executor):
    """Runs each job as a Ray job on the cluster at ``address`` (the dashboard's
    ``http://host:8265``; default ``$RAY_ADDRESS``, else a cluster on this machine).

    ``python`` is the interpreter the job's command starts on the workers (privsched must be
    installed there); the cluster is polled for job states at most every ``refresh`` seconds
    and for new output every ``log_refresh`` seconds. ``token``: the operator's Ray token
    (default: :func:`operator_token`'s sources), sent in every request's ``Authorization``
    header only. ``train_across_nodes``: data-parallel DP-SGD always trains with Ray Train
    across nodes (:func:`across_nodes`); without it, ranks that no node holds are refused."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        python: str = "python",
        refresh: float = 0.5,
        log_refresh: float = 2.0,
        token: str | None = None,
        train_across_nodes: bool = False,
    ) -> None:
        try:
            from ray.exceptions import AuthenticationError
            from ray.job_submission import JobSubmissionClient
        except ImportError:
            raise ValueError("the ray executor needs Ray: pip install 'privsched[ray]'") from None
        self._errors: tuple[type[BaseException], ...] = (*_CLUSTER_ERRORS, AuthenticationError)
        secret = operator_token(token)
        self._headers = {"Content-Type": "application/json"}
        if secret is not None:
            self._headers["Authorization"] = f"Bearer {secret}"
        where = address or os.environ.get("RAY_ADDRESS") or "this machine"
        try:
            self.client = JobSubmissionClient(address, headers=dict(self._headers))
        except AuthenticationError as exc:
            raise ValueError(_auth_refusal(exc, where)) from None
        except (OSError, RuntimeError, ValueError) as exc:
            raise ValueError(f"cannot reach a Ray cluster at {where}: {_first_line(exc)}") from None
        self.address = self.client.get_address()
        self.python = python
        self.refresh = refresh
        self.log_refresh = log_refresh
        self.train_across_nodes = train_across_nodes
        self._jobs: dict[int, _Job] = {}
        self._polled = -math.inf

    def __repr__(self) -> str:  # never the headers: they carry the token
        return f"RayExecutor({self.address!r})"

    # -- the cluster --------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, float]]:
        """Total resources of each alive node; one of the cluster errors if the cluster
        does not answer."""
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, NodeState, StateResource
        from ray.util.state.exception import RayStateApiException

        try:
            alive = StateApiClient(self.address, headers=dict(self._headers)).list(
                StateResource.NODES, options=ListApiOptions(limit=10_000, filters=[("state", "=", "ALIVE")]), raise_on_missing_output=True
            )
        except RayStateApiException as exc:
            raise RuntimeError(str(exc)) from None
        return [dict(cast(NodeState, node).resources_total) for node in alive]  # a listing of NODES holds NodeStates

    def pool(self, gpus: int | None = None, cpus: float | None = None, memory: int | None = None) -> Pool:
        """The cluster's pool (all alive nodes together), with any of its sizes overridden; it
        knows each node's size, and whether ranks may train across nodes, for submit's refusals."""
        declared = make_pool(0 if gpus is None else gpus, 1.0 if cpus is None else cpus, 0 if memory is None else memory)
        try:
            nodes = self.nodes()
        except self._errors as exc:
            raise ValueError(f"cannot list the nodes of the Ray cluster at {self.address}: {_first_line(exc)}") from None
        whole = cluster_pool(nodes)
        return Pool(
            whole.gpus if gpus is None else declared.gpus,
            whole.cpus if cpus is None else declared.cpus,
            whole.memory if memory is None else declared.memory,
            tuple((n.get("GPU", 0), n.get("CPU", 0), int(n.get("memory", 0))) for n in nodes),
            self.train_across_nodes,
        )

    def _info(self, job: _Job) -> Any | None:
        """Ray's record of the job, or None if the cluster has no such job. Raises one of
        the cluster errors when the cluster cannot answer."""
        try:
            return self.client.get_job_info(job.submission_id)
        except RuntimeError as exc:
            if "status code 404" in str(exc) or "does not exist" in str(exc):
                return None
            raise

    # -- the interface --------------------------------------------------------------------------

    def start(self, launch: Launch) -> None:
        try:
            nodes = self.nodes()
        except self._errors as exc:
            raise OSError(f"cannot reach the Ray cluster at {self.address}: {_first_line(exc)}") from None
        document = launch.context.read_text()
        shape = across_nodes(launch.placement, int(json.loads(document).get("workers", 1)), nodes, self.train_across_nodes)
        encoded = encode_document(document)
        if len(encoded) > MAX_CONTEXT_BYTES:
            raise UnplaceableJob(f"the job's context is {len(encoded)} bytes once encoded, over {MAX_CONTEXT_BYTES}")
        launch.result.unlink(missing_ok=True)
        launch.log.write_bytes(b"")  # the log file holds this Ray job's output only
        job = _Job(launch, submission_id(launch))
        env = _environment(launch.placement, encoded, self.sandbox, self.allow_network)
        held = launch.placement  # what the entry holds; across nodes, the ranks hold it and the driver nothing
        if shape is not None:
            env[RANKS_VARIABLE] = shape.to_json()
            held = Placement((), 0.0, 0)
        try:
            self.client.submit_job(
                entrypoint=f"{self.python} -m privsched.service.executors.ray_entry",
                submission_id=job.submission_id,
                runtime_env={"env_vars": env},
                metadata={"privsched_runs": str(launch.context.parent.parent), "privsched_pipeline": str(launch.pipeline_id)},
                entrypoint_num_gpus=len(held.gpus) or None,
                entrypoint_num_cpus=held.cpus or None,
                entrypoint_memory=held.memory or None,
            )
        except self._errors as exc:
            # The submission may have reached the cluster: watch the job unless Ray surely lacks it.
            try:
                known = self._info(job) is not None
            except self._errors:
                known = True  # cannot tell: watched, and failed conservatively if it never shows up
            if not known:
                raise OSError(f"Ray refused the job: {_first_line(exc)}") from None
        self._jobs[launch.pipeline_id] = job

    def attach(self, launch: Launch) -> bool:
        copied = launch.log.stat().st_size if launch.log.exists() else 0
        job = _Job(launch, submission_id(launch), copied=copied)
        self._jobs[launch.pipeline_id] = job
        try:
            info = self._info(job)
        except self._errors:
            return True  # the cluster does not answer: watched until it does
        return info is not None and not info.status.is_terminal()

    def cancel(self, pipeline_id: int, reason: str) -> None:
        job = self._jobs.get(pipeline_id)
        if job is not None and job.stop_reason is None:
            job.stop_reason = reason
            self._send_stop(job)

    def _send_stop(self, job: _Job) -> None:
        try:
            self.client.stop_job(job.submission_id)
            job.stop_sent = True
        except self._errors:
            pass  # retried by the next poll

    def poll(self, now: float) -> list[JobResult]:
        if now - self._polled < self.refresh:
            return []
        self._polled = now
        results = []
        for pipeline_id, job in list(self._jobs.items()):
            try:
                info = self._info(job)
            except self._errors:
                continue  # the cluster does not answer: try again later
            if info is None:
                del self._jobs[pipeline_id]
                results.append(read_result(job.launch, "vanished from the Ray cluster"))
                continue
            if not info.status.is_terminal():
                self._watch(job, now)
                continue
            logs = self._copy_logs(job)
            if logs is None:  # try again later; after a while, settle it without its output
                job.unread += 1
                if job.unread < UNREADABLE_POLLS:
                    continue
                logs = ""
            del self._jobs[pipeline_id]
            results.append(self._outcome(job, info, logs))
        return results

    def running(self) -> set[int]:
        return set(self._jobs)

    # -- helpers ----------------------------------------------------------------------------------

    def _watch(self, job: _Job, now: float) -> None:
        """Stop a job past its deadline (or whose stop did not get through), copy its output."""
        deadline = job.launch.deadline
        if job.stop_reason is None and deadline is not None and now > deadline:
            job.stop_reason = f"killed after exceeding its max_runtime of {job.launch.max_runtime:g} s"
        if job.stop_reason is not None and not job.stop_sent:
            self._send_stop(job)
        if now - job.logs_at >= self.log_refresh:
            job.logs_at = now
            self._copy_logs(job)

    def _copy_logs(self, job: _Job) -> str | None:
        """Append the job's new output to its log file; returns the whole output."""
        try:
            logs = self.client.get_job_logs(job.submission_id)
        except self._errors:
            return None
        data = logs.encode()
        if len(data) > job.copied:
            with open(job.launch.log, "ab") as log:
                log.write(data[job.copied :])
            job.copied = len(data)
            cap_log(job.launch.log)
        return logs

    def _outcome(self, job: _Job, info: Any, logs: str) -> JobResult:
        launch = job.launch
        result = parse_result(logs, launch.pipeline_id)
        if result is not None:
            write_atomic(launch.result, result.to_json())
        if job.stop_reason is not None:
            return failure(launch, job.stop_reason, result)  # charged unless its supervisor wrote that it never reached its data
        if result is not None:
            return result
        status = str(getattr(info.status, "value", info.status))
        detail = " ".join(str(info.message or "").split())[:300]
        error = str(getattr(info.error_type, "value", info.error_type or ""))
        if status == "STOPPED":
            return failure(launch, "stopped on the Ray cluster")
        if error in NEVER_STARTED:
            return JobResult(launch.pipeline_id, False, touched_data=False, message=f"Ray could not start the job: {detail}")
        return failure(launch, f"job ended on Ray ({status}) without reporting its result: {detail}")
